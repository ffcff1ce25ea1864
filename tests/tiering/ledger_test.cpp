#include "tiering/ledger.h"

#include <gtest/gtest.h>

using namespace tierlm::tiering;

TEST(Ledger, ChargesAndReleasesByAccount) {
  Ledger ledger(1000);
  ledger.charge("weights", 600);
  ledger.charge("kv", 300);
  EXPECT_EQ(ledger.used(), 900u);
  EXPECT_EQ(ledger.used("weights"), 600u);
  EXPECT_EQ(ledger.available(), 100u);
  ledger.release("weights", 600);
  EXPECT_EQ(ledger.used(), 300u);
  EXPECT_EQ(ledger.peak(), 900u);
}

TEST(Ledger, RefusesToExceedBudget) {
  Ledger ledger(1000);
  ledger.charge("weights", 900);
  EXPECT_FALSE(ledger.try_charge("kv", 101));
  EXPECT_THROW(ledger.charge("kv", 101), LedgerError);
  EXPECT_EQ(ledger.used(), 900u);  // a refused charge leaves no trace
  EXPECT_TRUE(ledger.try_charge("kv", 100));
  try {
    ledger.charge("scratch", 1);
    FAIL();
  } catch (const LedgerError& e) {
    EXPECT_NE(std::string(e.what()).find("scratch"), std::string::npos);
  }
}

TEST(Ledger, HugeRequestDoesNotOverflow) {
  Ledger ledger(1000);
  ledger.charge("a", 10);
  EXPECT_FALSE(ledger.try_charge("b", Ledger::kUnlimited - 5));
}

TEST(Ledger, BudgetCannotDropBelowUse) {
  Ledger ledger(1000);
  ledger.charge("a", 500);
  EXPECT_THROW(ledger.set_budget(400), LedgerError);
  ledger.set_budget(500);
  EXPECT_EQ(ledger.available(), 0u);
}

TEST(LedgerBuffer, ChargesForItsLifetime) {
  Ledger ledger(1 << 20);
  {
    LedgerBuffer a(ledger, "scratch", 4096);
    EXPECT_EQ(ledger.used("scratch"), 4096u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
    LedgerBuffer b = std::move(a);
    EXPECT_EQ(ledger.used("scratch"), 4096u);
    EXPECT_EQ(a.data(), nullptr);
  }
  EXPECT_EQ(ledger.used(), 0u);
  EXPECT_THROW(LedgerBuffer(ledger, "kv", 2 << 20), LedgerError);
  EXPECT_EQ(ledger.used(), 0u);
}
