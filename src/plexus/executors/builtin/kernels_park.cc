// The bodies of park and unpark (signatures_park.cc): a device's block of
// a value to a file of the park directory and back. Each device has a file
// of its own, `<dir>/<key>-s<shard>`, so a replicated value is written once
// a device and every device reads its own back. A file is written under a
// temporary name, synced and renamed, then the directory synced: a file
// under its name is whole. unpark deletes the file once it is read.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "plexus/executors/builtin/attrs.h"
#include "plexus/executors/builtin/kernel_support.h"

namespace plexus::builtin::internal {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// `<dir>/<key>-s<shard>`; the key is the server's, checked anyway: letters,
// digits, '-' and '_' only, so that it names a file of `dir` and no other.
absl::StatusOr<std::string> ParkPath(const KernelContext& ctx,
                                     const char* kernel) {
  absl::StatusOr<std::string> dir = GetStringAttr(AttrsOf(ctx), "dir");
  if (!dir.ok()) return dir.status();
  absl::StatusOr<std::string> key = GetStringAttr(AttrsOf(ctx), "key");
  if (!key.ok()) return key.status();
  bool plain = !key->empty() && !dir->empty();
  for (char c : *key) {
    plain &= (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
             (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  if (!plain) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernel, ": the park directory '", *dir, "' or key '", *key,
                     "' is not one the server makes"));
  }
  return absl::StrCat(*dir, "/", *key, "-s", ctx.shard);
}

absl::Status WriteAll(int fd, const char* data, size_t size,
                      const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot write", path);
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& path) {
  const std::string dir = path.substr(0, path.rfind('/'));
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open the park directory", dir);
  const int synced = ::fsync(fd);
  ::close(fd);
  if (synced != 0) return Errno("cannot sync the park directory", dir);
  return absl::OkStatus();
}

// park: input 0's block to its file; output 0 (uint8[1]) is 1 once it is
// there, synced.
class ParkBody : public KernelBody {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "park", 1, 1); !s.ok()) return s;
    absl::StatusOr<std::string> path = ParkPath(ctx, "park");
    if (!path.ok()) return path.status();
    const std::string tmp = *path + ".tmp";
    const int fd =
        ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return Errno("park: cannot create", tmp);
    absl::Status s = WriteAll(fd, ctx.inputs[0].as<char>(),
                              ctx.inputs[0].spec.byte_size(), tmp);
    if (s.ok() && ::fsync(fd) != 0) s = Errno("park: cannot sync", tmp);
    ::close(fd);
    if (s.ok() && ::rename(tmp.c_str(), path->c_str()) != 0) {
      s = Errno("park: cannot rename to", *path);
    }
    if (s.ok()) s = SyncDirectory(*path);
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
    if (ctx.outputs[0].spec.byte_size() > 0) {
      std::memset(ctx.outputs[0].data, 1, ctx.outputs[0].spec.byte_size());
    }
    return absl::OkStatus();
  }
};

// unpark: output 0's block from its file, which must hold exactly its
// bytes; the file is deleted once read.
class UnparkBody : public KernelBody {
 public:
  absl::Status Run(const KernelContext& ctx) const override {
    if (auto s = CheckRunArity(ctx, "unpark", 0, 1); !s.ok()) return s;
    absl::StatusOr<std::string> path = ParkPath(ctx, "unpark");
    if (!path.ok()) return path.status();
    const int fd = ::open(path->c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::DataLossError(
          absl::StrCat("unpark: the parked block ", *path, " cannot be read (",
                       std::strerror(errno),
                       "): it was read back already, or the park directory "
                       "is not the one every worker shares"));
    }
    struct stat st {};
    const size_t want = ctx.outputs[0].spec.byte_size();
    absl::Status s;
    if (::fstat(fd, &st) != 0) {
      s = Errno("unpark: cannot stat", *path);
    } else if (static_cast<size_t>(st.st_size) != want) {
      s = absl::DataLossError(absl::StrCat(
          "unpark: ", *path, " holds ", st.st_size, " bytes; the parked block ",
          ctx.outputs[0].spec.ToString(), " is ", want));
    }
    char* out = ctx.outputs[0].as<char>();
    size_t done = 0;
    while (s.ok() && done < want) {
      const ssize_t n = ::read(fd, out + done, want - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        s = n < 0 ? Errno("unpark: cannot read", *path)
                  : absl::DataLossError(
                        absl::StrCat("unpark: ", *path, " ended early"));
        break;
      }
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    if (!s.ok()) return s;
    ::unlink(path->c_str());
    return absl::OkStatus();
  }
};

}  // namespace

void AddParkBodies(KernelBodies& bodies) {
  AddBody<ParkBody>(bodies, "park");
  AddBody<UnparkBody>(bodies, "unpark");
}

}  // namespace plexus::builtin::internal
