#include "plexus/store/storage.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace plexus {
namespace {

bool AllZero(const Storage& s) {
  const auto* p = static_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size(); ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

TEST(StorageTest, SmallBlocksLiveOnTheHeapZeroFilledAndAligned) {
  auto s = Storage::Allocate(1000);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE((*s)->shared());
  EXPECT_EQ((*s)->fd(), -1);
  EXPECT_EQ((*s)->size(), 1000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*s)->data()) % 64, 0u);
  EXPECT_TRUE(AllZero(**s));
}

TEST(StorageTest, BlocksFromTheThresholdUpAreMemfdBacked) {
  auto below = Storage::Allocate(Storage::kShmThreshold - 1);
  auto at = Storage::Allocate(Storage::kShmThreshold);
  ASSERT_TRUE(below.ok() && at.ok());
  EXPECT_FALSE((*below)->shared());
  EXPECT_TRUE((*at)->shared());
  EXPECT_GE((*at)->fd(), 0);
  EXPECT_TRUE(AllZero(**at));
}

TEST(StorageTest, ForceShmMakesSmallBlocksShared) {
  auto s = Storage::Allocate(100, /*force_shm=*/true);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE((*s)->shared());
  EXPECT_EQ((*s)->size(), 100u);
  EXPECT_TRUE(AllZero(**s));
}

TEST(StorageTest, EmptyBlocksAreValid) {
  auto heap = Storage::Allocate(0);
  auto shm = Storage::Allocate(0, /*force_shm=*/true);
  ASSERT_TRUE(heap.ok() && shm.ok());
  EXPECT_EQ((*heap)->size(), 0u);
  EXPECT_TRUE((*shm)->shared());
  auto mapped = Storage::FromFd(dup((*shm)->fd()), 0);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ((*mapped)->size(), 0u);
}

TEST(StorageTest, FromFdOfADuplicateSeesTheSameBytes) {
  const size_t bytes = 1 << 20;
  auto original = Storage::Allocate(bytes);
  ASSERT_TRUE(original.ok()) << original.status();
  auto* p = static_cast<unsigned char*>((*original)->data());
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 7);

  auto mapped = Storage::FromFd(dup((*original)->fd()), bytes);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_TRUE((*mapped)->shared());
  EXPECT_NE((*mapped)->data(), (*original)->data());
  EXPECT_EQ(std::memcmp((*mapped)->data(), p, bytes), 0);
  // One file under both mappings: a later write shows through.
  p[12345] = 0xAB;
  EXPECT_EQ(static_cast<unsigned char*>((*mapped)->data())[12345], 0xAB);
}

TEST(StorageTest, FromFdRejectsAFileShorterThanClaimed) {
  auto original = Storage::Allocate(Storage::kShmThreshold);
  ASSERT_TRUE(original.ok());
  auto mapped =
      Storage::FromFd(dup((*original)->fd()), Storage::kShmThreshold + 1);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mapped.status().message().find("expected at least"),
            std::string::npos);
}

TEST(StorageTest, FromFdRejectsAFileThatCanShrink) {
  int fd = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  auto mapped = Storage::FromFd(fd, 4096);  // takes fd, also on error
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mapped.status().message().find("sealed"), std::string::npos);
}

TEST(StorageTest, FromFdNamesTheFailingSyscall) {
  auto mapped = Storage::FromFd(/*fd=*/1000000, 16);  // not open
  EXPECT_FALSE(mapped.ok());
  EXPECT_NE(mapped.status().message().find("fstat"), std::string::npos);
}

// A view that reads its block when it goes: what a runtime's zero-copy
// buffer may do until it is destroyed (HostViews).
struct ReadsWhenGone {
  const char* bytes;
  int* seen;
  ~ReadsWhenGone() { *seen = bytes[0]; }
};

TEST(StorageTest, ItsViewsGoBeforeItsBytes) {
  auto block = Storage::Allocate(64);
  ASSERT_TRUE(block.ok());
  static_cast<char*>((*block)->data())[0] = 42;
  int seen = 0;
  const int maker = 0;
  (*block)->views().Keep(
      {&maker, nullptr, TensorSpec{DType::kF32, {16}}},
      std::make_shared<ReadsWhenGone>(
          ReadsWhenGone{static_cast<const char*>((*block)->data()), &seen}));
  EXPECT_EQ((*block)->views().size(), 1u);
  block->reset();  // (under ASan a read after the free fails here)
  EXPECT_EQ(seen, 42);
}

TEST(StorageTest, ARecycledBlockKeepsNoViews) {
  auto block = Storage::AllocateForWrite(Storage::kShmThreshold);
  ASSERT_TRUE(block.ok());
  const int maker = 0;
  auto view = std::make_shared<int>(7);
  std::weak_ptr<int> watch = view;
  (*block)->views().Keep({&maker, nullptr, TensorSpec{DType::kU8, {8}}},
                         std::move(view));
  block->reset();  // back to the cache of blocks for reuse
  EXPECT_TRUE(watch.expired());
  auto again = Storage::AllocateForWrite(Storage::kShmThreshold);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->views().size(), 0u);
}

}  // namespace
}  // namespace plexus

namespace plexus {
namespace {

TEST(StorageCacheTest, FreedPrivateBlockIsReusedAndSharedBlockIsNot) {
  constexpr size_t kBytes = Storage::kShmThreshold * 3;
  Storage::SetCacheLimit(64 << 20);
  const size_t before = Storage::CachedBytes();
  const void* first_data = nullptr;
  {
    auto block = Storage::AllocateForWrite(kBytes);
    ASSERT_TRUE(block.ok());
    first_data = (*block)->data();
  }
  EXPECT_EQ(Storage::CachedBytes(), before + kBytes);
  {
    auto again = Storage::AllocateForWrite(kBytes);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ((*again)->data(), first_data);  // the same mapping, reused
    EXPECT_EQ(Storage::CachedBytes(), before);
    (void)(*again)->fd();  // handed to another process: never recycled
  }
  EXPECT_EQ(Storage::CachedBytes(), before);
}

// Device memory as a GPU's is to host code: not addressable, only copied
// out; or, as the CPU plugin's, readable in place.
class TestDeviceBuffer : public DeviceBuffer {
 public:
  TestDeviceBuffer(std::vector<unsigned char> bytes, bool addressable)
      : bytes_(std::move(bytes)), addressable_(addressable) {}
  size_t size() const override { return bytes_.size(); }
  absl::Status Await() const override { return error_; }
  const void* host_address() const override {
    return addressable_ && error_.ok() ? bytes_.data() : nullptr;
  }
  // Its producer failed: every host reader gets this.
  void set_error(absl::Status error) { error_ = std::move(error); }
  absl::Status CopyToHost(void* dst) const override {
    std::memcpy(dst, bytes_.data(), bytes_.size());
    MemoryTraffic::device_to_host() += static_cast<int64_t>(bytes_.size());
    return absl::OkStatus();
  }

 private:
  std::vector<unsigned char> bytes_;
  const bool addressable_;
  absl::Status error_;
};

TEST(StorageTest, AFailedDeviceValueFailsItsHostReaders) {
  for (bool addressable : {false, true}) {
    auto buffer = std::make_shared<TestDeviceBuffer>(
        std::vector<unsigned char>(64, 1), addressable);
    buffer->set_error(absl::ResourceExhaustedError(
        "program 'f' on worker 1: XLA execution: out of memory"));
    std::shared_ptr<const Storage> held = Storage::OnDevice(buffer);
    EXPECT_EQ(held->data(), nullptr);
    for (bool shareable : {false, true}) {
      auto host = Storage::InHostMemory(held, shareable);
      ASSERT_FALSE(host.ok());
      EXPECT_EQ(host.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_NE(host.status().message().find("program 'f'"), std::string::npos)
          << host.status();
    }
  }
}

std::vector<unsigned char> Pattern(size_t n) {
  std::vector<unsigned char> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(i * 7);
  return bytes;
}

TEST(StorageTest, HostMemoryIsReadAsItIs) {
  auto s = Storage::Allocate(Storage::kShmThreshold);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->kind(), MemoryKind::kHost);
  EXPECT_EQ((*s)->device_buffer(), nullptr);
  auto host = Storage::InHostMemory(*s, /*shareable=*/true);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->get(), s->get());
}

TEST(StorageTest, DeviceMemoryHostCodeCannotAddressIsCopiedOutOnce) {
  const int64_t before = MemoryTraffic::device_to_host().load();
  auto buffer = std::make_shared<TestDeviceBuffer>(Pattern(1000), false);
  std::shared_ptr<const Storage> held = Storage::OnDevice(buffer);
  EXPECT_EQ(held->kind(), MemoryKind::kDevice);
  EXPECT_EQ(held->device_buffer(), buffer.get());
  EXPECT_EQ(held->data(), nullptr);
  EXPECT_EQ(held->size(), 1000u);
  EXPECT_FALSE(held->shared());
  auto host = Storage::InHostMemory(held, /*shareable=*/false);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ((*host)->kind(), MemoryKind::kHost);
  ASSERT_EQ((*host)->size(), 1000u);
  EXPECT_EQ(std::memcmp((*host)->data(), Pattern(1000).data(), 1000), 0);
  EXPECT_EQ(MemoryTraffic::device_to_host().load(), before + 1000);
}

TEST(StorageTest, AddressableDeviceMemoryIsReadInPlaceUnlessItMustBeShared) {
  const size_t big = Storage::kShmThreshold;
  auto buffer = std::make_shared<TestDeviceBuffer>(Pattern(big), true);
  std::shared_ptr<const Storage> held = Storage::OnDevice(buffer);
  EXPECT_EQ(held->data(), buffer->host_address());
  const int64_t before = MemoryTraffic::device_to_host().load();
  auto in_place = Storage::InHostMemory(held, /*shareable=*/false);
  ASSERT_TRUE(in_place.ok());
  EXPECT_EQ(in_place->get(), held.get());
  EXPECT_EQ(MemoryTraffic::device_to_host().load(), before);
  // For another process: a memfd the data plane can hand over.
  auto shared = Storage::InHostMemory(held, /*shareable=*/true);
  ASSERT_TRUE(shared.ok());
  EXPECT_TRUE((*shared)->shared());
  EXPECT_EQ(std::memcmp((*shared)->data(), Pattern(big).data(), big), 0);
  EXPECT_EQ(MemoryTraffic::device_to_host().load(),
            before + static_cast<int64_t>(big));
  // A small one goes by socket anyway: read in place.
  auto small =
      Storage::OnDevice(std::make_shared<TestDeviceBuffer>(Pattern(100), true));
  auto small_host = Storage::InHostMemory(small, /*shareable=*/true);
  ASSERT_TRUE(small_host.ok());
  EXPECT_EQ(small_host->get(), small.get());
}

}  // namespace
}  // namespace plexus
