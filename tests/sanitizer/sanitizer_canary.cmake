# cmake -DCANARY=<sanitizer_canary> -DBUG=<name> -DREPORT=<text> -DDIR=<folder>
#       [-DON_STDERR=ON] -P sanitizer_canary.cmake
# Runs the canary's planted bug with every report sent to DIR (not to the
# stage's own report folder, which must stay empty) and fails unless the
# process failed and a report in DIR names the bug (with ON_STDERR, its
# output does: abseil's deadlock detection writes there).
file(REMOVE_RECURSE ${DIR})
file(MAKE_DIRECTORY ${DIR})
foreach(tool ASAN UBSAN TSAN)
  set(ENV{${tool}_OPTIONS} "$ENV{${tool}_OPTIONS}:log_path=${DIR}/report")
endforeach()
execute_process(COMMAND ${CANARY} ${BUG} RESULT_VARIABLE result
  OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(result EQUAL 0)
  message(FATAL_ERROR "sanitizer canary: ${BUG} went unnoticed:\n${out}")
endif()
if(ON_STDERR)
  string(FIND "${out}" "${REPORT}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "sanitizer canary: ${BUG} stopped the process "
      "(${result}) without saying \"${REPORT}\":\n${out}")
  endif()
  message(STATUS "sanitizer canary: ${BUG} caught")
  return()
endif()
file(GLOB reports ${DIR}/report.*)
if(NOT reports)
  message(FATAL_ERROR "sanitizer canary: ${BUG} stopped the process "
    "(${result}) but left no report in ${DIR}:\n${out}")
endif()
list(GET reports 0 report)
file(READ ${report} text)
string(FIND "${text}" "${REPORT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "sanitizer canary: ${report} does not say "
    "\"${REPORT}\":\n${text}")
endif()
message(STATUS "sanitizer canary: ${BUG} caught, report in ${report}")
