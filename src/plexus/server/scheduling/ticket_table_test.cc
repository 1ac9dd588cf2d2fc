#include "plexus/server/scheduling/ticket_table.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace plexus {
namespace {

// Every ticket listed, in order (ForEach lists the stragglers first, in
// the map's order).
std::vector<uint64_t> Tickets(const TicketTable<std::string>& t) {
  std::vector<uint64_t> out;
  t.ForEach(
      [&](uint64_t ticket, const std::string&) { out.push_back(ticket); });
  std::sort(out.begin(), out.end());
  return out;
}

TEST(TicketTableTest, RecordsAreFoundByTicketUntilErased) {
  TicketTable<std::string> t(/*span=*/8);
  EXPECT_EQ(t.Find(1), nullptr);  // empty
  t.Add(5) = "five";
  t.Add(6) = "six";
  t.Add(9) = "nine";  // 7 and 8 never added: absent
  EXPECT_EQ(t.size(), 3u);
  ASSERT_NE(t.Find(6), nullptr);
  EXPECT_EQ(*t.Find(6), "six");
  EXPECT_EQ(t.Find(7), nullptr);
  EXPECT_EQ(t.Find(4), nullptr);   // before the first
  EXPECT_EQ(t.Find(10), nullptr);  // after the last
  t.Erase(6);
  t.Erase(6);  // twice: nothing
  t.Erase(7);  // never added: nothing
  EXPECT_EQ(t.Find(6), nullptr);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(Tickets(t), (std::vector<uint64_t>{5, 9}));
  t.Erase(5);
  t.Erase(9);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(Tickets(t), std::vector<uint64_t>{});
  t.Add(20) = "twenty";  // after emptying, a later ticket starts it again
  EXPECT_EQ(*t.Find(20), "twenty");
  EXPECT_EQ(t.Find(9), nullptr);
}

// A record that stays while many later ones come and go leaves the ring
// for the map: the ring holds at most `span` slots, and the straggler is
// still found, listed and erased.
TEST(TicketTableTest, AStragglerMovesOutOfTheRingAndStaysFound) {
  TicketTable<std::string> t(/*span=*/4);
  t.Add(1) = "straggler";
  for (uint64_t k = 2; k < 1000; ++k) {
    t.Add(k) = std::to_string(k);
    if (k > 3) t.Erase(k - 2);  // later ones end in order, two in flight
  }
  ASSERT_NE(t.Find(1), nullptr);
  EXPECT_EQ(*t.Find(1), "straggler");
  EXPECT_EQ(*t.Find(999), "999");
  EXPECT_EQ(*t.Find(998), "998");
  EXPECT_EQ(t.Find(500), nullptr);
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(Tickets(t), (std::vector<uint64_t>{1, 998, 999}));
  t.Erase(1);
  EXPECT_EQ(t.Find(1), nullptr);
  EXPECT_EQ(t.size(), 2u);
  // A record kept in the ring only: span 4 holds the last four tickets.
  t.Add(1005) = "far";  // pushes 998 and 999 out of the ring
  EXPECT_EQ(*t.Find(998), "998");
  EXPECT_EQ(*t.Find(1005), "far");
  EXPECT_EQ(Tickets(t), (std::vector<uint64_t>{998, 999, 1005}));
}

}  // namespace
}  // namespace plexus
