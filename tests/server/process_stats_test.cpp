#include "server/process_stats.h"

#include <gtest/gtest.h>

#include <fstream>

namespace tierlm::server {
namespace {

namespace fs = std::filesystem;

struct FakeTree {
  fs::path root;
  FakeTree() {
    root = fs::temp_directory_path() / ("tierlm_cgroup_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter()++));
    fs::create_directories(root);
  }
  ~FakeTree() { fs::remove_all(root); }
  void write(const fs::path& rel, const std::string& text) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text;
  }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

TEST(ProcessStats, ResidentSetOfThisProcess) {
  auto rss = resident_set_bytes();
  ASSERT_TRUE(rss.has_value());
  EXPECT_GT(*rss, 1u << 20);
}

// The peak resident set is at least the current one; a status file without VmHWM (or a malformed one) is unknown.
TEST(ProcessStats, PeakResidentSet) {
  // Current first, then peak: the resident set may grow between the two reads, and the peak read later covers it.
  const auto current = resident_set_bytes();
  const auto peak = peak_resident_set_bytes();
  ASSERT_TRUE(peak.has_value());
  ASSERT_TRUE(current.has_value());
  EXPECT_GE(*peak, *current);
  FakeTree t;
  t.write("status", "Name:\ttest\nVmHWM:\t   2048 kB\nVmRSS:\t1024 kB\n");
  EXPECT_EQ(peak_resident_set_bytes(t.root / "status"), std::optional<uint64_t>(2048u * 1024));
  t.write("bad", "VmHWM:\tlots kB\n");
  EXPECT_FALSE(peak_resident_set_bytes(t.root / "bad").has_value());
  EXPECT_FALSE(peak_resident_set_bytes("/nonexistent/status").has_value());
}

TEST(ProcessStats, CgroupV2Limit) {
  FakeTree t;
  t.write("proc_cgroup", "0::/user.slice/app\n");
  t.write("fs/user.slice/app/memory.max", "1073741824\n");
  t.write("fs/user.slice/app/memory.current", "12345\n");
  auto m = cgroup_memory(t.root / "proc_cgroup", t.root / "fs");
  EXPECT_EQ(m.version, 2);
  EXPECT_EQ(m.limit_bytes, 1073741824u);
  EXPECT_EQ(m.usage_bytes, 12345u);
}

TEST(ProcessStats, CgroupV2Unlimited) {
  FakeTree t;
  t.write("proc_cgroup", "0::/\n");
  t.write("fs/memory.max", "max\n");
  auto m = cgroup_memory(t.root / "proc_cgroup", t.root / "fs");
  EXPECT_EQ(m.version, 2);
  EXPECT_FALSE(m.limit_bytes.has_value());
}

TEST(ProcessStats, CgroupV1LimitOnHybridHost) {
  FakeTree t;
  // A hybrid host lists "0::/" but has no v2 memory controller; v1's memory hierarchy holds the limit.
  t.write("proc_cgroup", "9:name=systemd:/\n4:memory:/job/42\n0::/\n");
  t.write("fs/unified/cgroup.procs", "");
  t.write("fs/memory/job/42/memory.limit_in_bytes", "536870912\n");
  t.write("fs/memory/job/42/memory.usage_in_bytes", "1000\n");
  auto m = cgroup_memory(t.root / "proc_cgroup", t.root / "fs");
  EXPECT_EQ(m.version, 1);
  EXPECT_EQ(m.limit_bytes, 536870912u);
  EXPECT_EQ(m.usage_bytes, 1000u);
}

TEST(ProcessStats, CgroupV1UnlimitedIsNoLimit) {
  FakeTree t;
  t.write("proc_cgroup", "4:cpu,memory:/\n");
  t.write("fs/memory/memory.limit_in_bytes", "9223372036854771712\n");
  auto m = cgroup_memory(t.root / "proc_cgroup", t.root / "fs");
  EXPECT_EQ(m.version, 1);
  EXPECT_FALSE(m.limit_bytes.has_value());
}

TEST(ProcessStats, MissingFilesAreUnknownNotErrors) {
  auto m = cgroup_memory("/nonexistent/cgroup", "/nonexistent/fs");
  EXPECT_EQ(m.version, 0);
  EXPECT_FALSE(m.limit_bytes.has_value());
  EXPECT_FALSE(resident_set_bytes("/nonexistent/statm").has_value());
}

}  // namespace
}  // namespace tierlm::server
