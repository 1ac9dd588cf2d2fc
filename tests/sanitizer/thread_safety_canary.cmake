# cmake -DCXX=<clang++> -DFLAGS=<flags;...> -DINCLUDES=<dirs;...>
#       -DSOURCE=thread_safety_canary.cc -P thread_safety_canary.cmake
# Fails unless each planted bug of SOURCE fails to compile with the
# diagnostic it plants and the file without a plant compiles.
set(expected
  "1|writing variable 'value_' requires holding mutex 'mu_'"
  "2|calling function 'BumpLocked' requires holding mutex 'mu_'"
  "3|mutex 'mu_' must be acquired before 'second_'")
set(include_flags)
foreach(dir ${INCLUDES})
  list(APPEND include_flags -I${dir})
endforeach()
function(compile plant result_var output_var)
  execute_process(
    COMMAND ${CXX} -std=c++17 -fsyntax-only ${FLAGS} ${include_flags}
      -DPLANT=${plant} ${SOURCE}
    RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(${result_var} ${result} PARENT_SCOPE)
  set(${output_var} "${out}" PARENT_SCOPE)
endfunction()
compile(0 result out)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "thread-safety canary: the file without a plant does "
    "not compile:\n${out}")
endif()
foreach(entry ${expected})
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 plant)
  list(GET parts 1 diagnostic)
  compile(${plant} result out)
  if(result EQUAL 0)
    message(FATAL_ERROR "thread-safety canary: plant ${plant} compiled: the "
      "analysis is off (expected \"${diagnostic}\")")
  endif()
  string(FIND "${out}" "${diagnostic}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "thread-safety canary: plant ${plant} failed without "
      "\"${diagnostic}\":\n${out}")
  endif()
endforeach()
message(STATUS "thread-safety canary: 3 planted bugs refused")
