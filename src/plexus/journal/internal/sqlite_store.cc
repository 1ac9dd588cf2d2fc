#include "plexus/journal/internal/sqlite_store.h"

#include <sqlite3.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace plexus::journal::internal {
namespace {

// A prepared statement, finalized when it goes.
struct Statement {
  sqlite3_stmt* stmt = nullptr;
  ~Statement() { sqlite3_finalize(stmt); }
};

class SqliteStore : public JournalStore {
 public:
  SqliteStore(std::string path, sqlite3* db)
      : path_(std::move(path)), db_(db) {}
  ~SqliteStore() override {
    sqlite3_finalize(insert_);
    sqlite3_close_v2(db_);  // checkpoints the WAL into the file
  }

  absl::Status Prepare() {
    if (int rc = sqlite3_prepare_v2(
            db_, "INSERT INTO records(seq, record) VALUES(?1, ?2)", -1,
            &insert_, nullptr);
        rc != SQLITE_OK) {
      return Error("prepare insert", rc);
    }
    return absl::OkStatus();
  }

  absl::Status Write(absl::Span<const StoredRecord> records) override {
    if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
    for (const StoredRecord& r : records) {
      if (absl::Status s = Insert(r); !s.ok()) {
        Exec("ROLLBACK").IgnoreError();
        return s;
      }
    }
    return Exec("COMMIT");  // synchronous=FULL: the WAL is fsynced
  }

  absl::Status Scan(
      absl::FunctionRef<bool(uint64_t, absl::string_view)> fn) override {
    Statement s;
    if (int rc = sqlite3_prepare_v2(
            db_, "SELECT seq, record FROM records ORDER BY seq", -1, &s.stmt,
            nullptr);
        rc != SQLITE_OK) {
      return Error("read the records", rc);
    }
    while (true) {
      int rc = sqlite3_step(s.stmt);
      if (rc == SQLITE_DONE) return absl::OkStatus();
      if (rc != SQLITE_ROW) return Error("read the records", rc);
      const auto key = static_cast<uint64_t>(sqlite3_column_int64(s.stmt, 0));
      const void* blob = sqlite3_column_blob(s.stmt, 1);
      const int size = sqlite3_column_bytes(s.stmt, 1);
      absl::string_view value(static_cast<const char*>(blob),
                              blob == nullptr ? 0 : size);
      if (!fn(key, value)) return absl::OkStatus();
    }
  }

  absl::Status ReplacePrefix(const StoredRecord& replacement) override {
    if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
    absl::Status s = Exec(
        absl::StrCat("DELETE FROM records WHERE seq <= ", replacement.key));
    if (s.ok()) s = Insert(replacement);
    if (!s.ok()) {
      Exec("ROLLBACK").IgnoreError();
      return s;
    }
    if (s = Exec("COMMIT"); !s.ok()) return s;
    // Copies the WAL into the file and empties it: with the rows the
    // snapshot replaced free for reuse, the journal's size stays bounded.
    return Exec("PRAGMA wal_checkpoint(TRUNCATE)");
  }

  absl::StatusOr<uint64_t> DiscardFrom(uint64_t from) override {
    if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
    absl::Status s = Exec(absl::StrCat(
        "INSERT INTO untrusted(seq, record, moved_at) SELECT seq, record, "
        "datetime('now') FROM records WHERE seq >= ",
        from));
    const uint64_t moved = static_cast<uint64_t>(sqlite3_changes(db_));
    if (s.ok()) {
      s = Exec(absl::StrCat("DELETE FROM records WHERE seq >= ", from));
    }
    if (!s.ok()) {
      Exec("ROLLBACK").IgnoreError();
      return s;
    }
    if (s = Exec("COMMIT"); !s.ok()) return s;
    return moved;
  }

  absl::Status Exec(const std::string& sql) {
    char* message = nullptr;
    int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &message);
    if (rc == SQLITE_OK) return absl::OkStatus();
    std::string text = message != nullptr ? message : sqlite3_errstr(rc);
    sqlite3_free(message);
    return Error(absl::StrCat("run \"", sql.substr(0, 40), "\""), rc, text);
  }

  // Maps SQLite's result code to a Status naming the path and the step.
  absl::Status Error(absl::string_view step, int rc, std::string text = "") {
    if (text.empty()) text = sqlite3_errmsg(db_);
    std::string message = absl::StrCat("journal ", path_, ": cannot ", step,
                                       ": ", text, " (SQLite ", rc, ")");
    switch (rc & 0xff) {
      case SQLITE_BUSY:
      case SQLITE_LOCKED:
        return absl::FailedPreconditionError(
            absl::StrCat(message, "; is another process using this journal?"));
      case SQLITE_CORRUPT:
      case SQLITE_NOTADB:
        return absl::DataLossError(message);
      default:
        return absl::InternalError(message);
    }
  }

 private:
  absl::Status Insert(const StoredRecord& r) {
    sqlite3_reset(insert_);
    sqlite3_bind_int64(insert_, 1, static_cast<sqlite3_int64>(r.key));
    sqlite3_bind_blob64(insert_, 2, r.value.data(), r.value.size(),
                        SQLITE_STATIC);
    int rc = sqlite3_step(insert_);
    sqlite3_clear_bindings(insert_);
    if (rc != SQLITE_DONE) {
      return Error(absl::StrCat("write record ", r.key), rc);
    }
    return absl::OkStatus();
  }

  const std::string path_;
  sqlite3* const db_;
  sqlite3_stmt* insert_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<JournalStore>> OpenSqliteStore(
    const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
      nullptr);
  if (db == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("journal ", path, ": cannot open: out of memory"));
  }
  auto store = std::make_unique<SqliteStore>(path, db);
  if (rc != SQLITE_OK) return store->Error("open", rc);
  // EXCLUSIVE before WAL: the WAL index lives in this process's memory (no
  // -shm file) and the file stays locked to this process until close.
  // synchronous=FULL: every commit fsyncs the WAL (NORMAL would not).
  for (const char* sql :
       {"PRAGMA locking_mode=EXCLUSIVE", "PRAGMA journal_mode=WAL",
        "PRAGMA synchronous=FULL",
        "CREATE TABLE IF NOT EXISTS records(seq INTEGER PRIMARY KEY, "
        "record BLOB NOT NULL)",
        "CREATE TABLE IF NOT EXISTS untrusted(seq INTEGER, record BLOB, "
        "moved_at TEXT)",
        // Takes the exclusive lock now, so a second process fails at Open.
        "BEGIN EXCLUSIVE", "COMMIT"}) {
    if (absl::Status s = store->Exec(sql); !s.ok()) return s;
  }
  if (absl::Status s = store->Prepare(); !s.ok()) return s;
  return store;
}

}  // namespace plexus::journal::internal
