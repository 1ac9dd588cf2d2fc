#include "plexus/journal/internal/leveldb_store.h"

#include <leveldb/db.h>
#include <leveldb/write_batch.h>

#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/strings/str_cat.h"

namespace plexus::journal::internal {
namespace {

std::string Key(uint64_t seq) {
  std::string key(8, '\0');
  absl::big_endian::Store64(key.data(), seq);
  return key;
}

class LevelDbStore : public JournalStore {
 public:
  LevelDbStore(std::string path, leveldb::DB* db)
      : path_(std::move(path)), db_(db) {}

  absl::Status Write(absl::Span<const StoredRecord> records) override {
    leveldb::WriteBatch batch;
    for (const StoredRecord& r : records) batch.Put(Key(r.key), r.value);
    return Check("write", db_->Write(Synced(), &batch));
  }

  absl::Status Scan(
      absl::FunctionRef<bool(uint64_t, absl::string_view)> fn) override {
    std::unique_ptr<leveldb::Iterator> it(
        db_->NewIterator(leveldb::ReadOptions()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (it->key().size() != 8) {
        return absl::DataLossError(absl::StrCat("journal ", path_,
                                                ": a key of ", it->key().size(),
                                                " bytes, not 8"));
      }
      if (!fn(absl::big_endian::Load64(it->key().data()),
              absl::string_view(it->value().data(), it->value().size()))) {
        break;
      }
    }
    return Check("read", it->status());
  }

  absl::Status ReplacePrefix(const StoredRecord& replacement) override {
    leveldb::WriteBatch batch;
    const std::string last = Key(replacement.key);
    std::unique_ptr<leveldb::Iterator> it(
        db_->NewIterator(leveldb::ReadOptions()));
    for (it->SeekToFirst(); it->Valid() && it->key().compare(last) <= 0;
         it->Next()) {
      batch.Delete(it->key());
    }
    batch.Put(last, replacement.value);
    return Check("compact", db_->Write(Synced(), &batch));
  }

  absl::StatusOr<uint64_t> DiscardFrom(uint64_t from) override {
    leveldb::WriteBatch batch;
    uint64_t n = 0;
    std::unique_ptr<leveldb::Iterator> it(
        db_->NewIterator(leveldb::ReadOptions()));
    for (it->Seek(Key(from)); it->Valid(); it->Next(), ++n) {
      batch.Delete(it->key());
    }
    if (absl::Status s = Check("discard", db_->Write(Synced(), &batch));
        !s.ok()) {
      return s;
    }
    return n;
  }

 private:
  static leveldb::WriteOptions Synced() {
    leveldb::WriteOptions options;
    options.sync = true;
    return options;
  }
  absl::Status Check(absl::string_view step, const leveldb::Status& s) {
    if (s.ok()) return absl::OkStatus();
    std::string message =
        absl::StrCat("journal ", path_, ": cannot ", step, ": ", s.ToString());
    return s.IsCorruption() ? absl::DataLossError(message)
                            : absl::InternalError(message);
  }

  const std::string path_;
  const std::unique_ptr<leveldb::DB> db_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<JournalStore>> OpenLevelDbStore(
    const std::string& path) {
  leveldb::Options options;
  options.create_if_missing = true;
  leveldb::DB* db = nullptr;
  leveldb::Status s = leveldb::DB::Open(options, path, &db);
  if (!s.ok()) {
    return absl::InternalError(
        absl::StrCat("journal ", path, ": cannot open: ", s.ToString()));
  }
  return std::make_unique<LevelDbStore>(path, db);
}

}  // namespace plexus::journal::internal
