// ShmArena, ShmMapCache, Segment and remove_stale_segments (runtime/shm.hpp).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dopt/runtime/error.hpp"
#include "dopt/runtime/internal/shm.hpp"

namespace shm = dopt::shm;

namespace {

bool exists_in_dev_shm(const std::string& name) {  // name: "/dopt-..."
  return std::filesystem::exists("/dev/shm" + name);
}

// The pid of a process that has exited and been reaped (no longer exists).
pid_t dead_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  int st = 0;
  ::waitpid(p, &st, 0);
  return p;
}

}  // namespace

TEST_CASE("shm arena: blocks by power-of-two class, reused once free, seen by a map cache", "[shm][runtime]") {
  shm::ShmArena arena("arena-test");
  CHECK(arena.mapped_bytes() == 0);
  auto a = arena.allocate(100);
  auto b = arena.allocate(5000);
  auto z = arena.allocate(0);
  CHECK(a->ref.bytes == 4096);  // smallest class
  CHECK(b->ref.bytes == 8192);
  CHECK(z->ref.bytes == 4096);
  CHECK(a->ref.segment.rfind("/dopt-" + std::to_string(::getpid()) + "-arena-test-", 0) == 0);
  CHECK(arena.mapped_bytes() >= 2u << 20);  // small classes share 1 MiB segments
  CHECK(a->ptr != z->ptr);

  // A peer (here: a map cache in the same process) sees the same bytes.
  std::memset(a->ptr, 0x5a, 100);
  shm::ShmMapCache cache;
  std::shared_ptr<void> keep;
  auto* seen = static_cast<unsigned char*>(cache.resolve(a->ref, &keep));
  CHECK(seen != a->ptr);  // a second mapping of the same segment
  CHECK(seen[0] == 0x5a);
  CHECK(seen[99] == 0x5a);
  seen[1] = 0x11;
  CHECK(static_cast<unsigned char*>(a->ptr)[1] == 0x11);

  // A freed block comes back for the next request of its class; nothing new is mapped.
  const auto ref = a->ref;
  const auto mapped = arena.mapped_bytes();
  a.reset();
  auto again = arena.allocate(4000);
  CHECK(again->ref.segment == ref.segment);
  CHECK(again->ref.offset == ref.offset);
  CHECK(arena.mapped_bytes() == mapped);

  // A block larger than a slab gets its own segment.
  auto big = arena.allocate((3u << 20) + 1);
  CHECK(big->ref.bytes == 4u << 20);
  CHECK(big->ref.offset == 0);

  // A reference outside the segment is an IOError naming it.
  auto bad = ref;
  bad.offset = 2u << 20;
  CHECK_THROWS_AS(cache.resolve(bad), dopt::IOError);
}

TEST_CASE("shm arena: segments are unlinked with the arena, blocks outlive it", "[shm][runtime]") {
  std::string name;
  std::shared_ptr<shm::ShmArena::Block> block;
  {
    shm::ShmArena arena("lifetime-test");
    block = arena.allocate(64);
    name = block->ref.segment;
    CHECK(exists_in_dev_shm(name));
    std::memset(block->ptr, 7, 64);
  }
  CHECK_FALSE(exists_in_dev_shm(name));
  CHECK(static_cast<unsigned char*>(block->ptr)[63] == 7);  // still mapped
  block.reset();
}

TEST_CASE("shm arena: many threads allocate and free at once", "[shm][runtime]") {
  shm::ShmArena arena("threads-test");
  std::vector<std::thread> ts;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      std::vector<std::shared_ptr<shm::ShmArena::Block>> held;
      for (int i = 0; i < 200; ++i) {
        held.push_back(arena.allocate(static_cast<std::size_t>(64 << (i % 5))));
        std::memset(held.back()->ptr, t, 64);
        if (i % 3 == 0) held.erase(held.begin());
      }
      std::set<void*> distinct;
      for (auto& b : held) distinct.insert(b->ptr);
      ok[static_cast<std::size_t>(t)] = distinct.size() == held.size();
    });
  for (auto& t : ts) t.join();
  CHECK(ok == std::vector<int>(4, 1));
}

TEST_CASE("shm segment: errors name the segment", "[shm][runtime]") {
  const std::string name = "/dopt-" + std::to_string(::getpid()) + "-segment-test";
  CHECK_THROWS_AS(shm::Segment::create(name, 0), dopt::ValueError);
  CHECK_THROWS_WITH(shm::Segment::open(name, 16), Catch::Contains(name));
  {
    auto s = shm::Segment::create(name, 4096);
    CHECK_THROWS_AS(shm::Segment::create(name, 4096), dopt::IOError);  // exists
    CHECK_THROWS_WITH(shm::Segment::open(name, 8192), Catch::Contains("smaller than 8192"));
    auto peer = shm::Segment::open(name, 4096);
    CHECK(peer->size() == 4096);
    s->unlink();
    CHECK_FALSE(exists_in_dev_shm(name));
    s->unlink();  // idempotent
  }
  CHECK_FALSE(exists_in_dev_shm(name));
}

TEST_CASE("remove_stale_segments removes what dead processes left, nothing of the living", "[shm][runtime]") {
  const pid_t dead = dead_pid();
  const std::string stale = "/dopt-" + std::to_string(dead) + "-stale-test-0";
  const int fd = ::shm_open(stale.c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
  shm::ShmArena arena("alive-test");
  auto mine = arena.allocate(16);
  // Names that are not dopt's are left alone.
  const std::string foreign = "/dopt-notapid-test";
  const int fd2 = ::shm_open(foreign.c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(fd2 >= 0);
  ::close(fd2);

  CHECK(shm::remove_stale_segments() >= 1);
  CHECK_FALSE(exists_in_dev_shm(stale));
  CHECK(exists_in_dev_shm(mine->ref.segment));
  CHECK(exists_in_dev_shm(foreign));
  ::shm_unlink(foreign.c_str());
}

TEST_CASE("shm segment: the huge pages it got, and /dev/shm's huge= mode", "[shm][runtime][huge]") {
  // tests/huge_shm_namespace.sh runs this with a tmpfs mounted huge=always
  // over /dev/shm in a mount namespace of its own (DOPT_TEST_EXPECT_HUGE_SHM=1).
  const std::string mode = shm::dev_shm_huge_mode();
  INFO("/dev/shm huge=" << mode);
  CHECK((mode == "never" || mode == "always" || mode == "within_size" || mode == "advise" || mode == "deny" ||
         mode == "force" || mode.empty()));
  constexpr std::size_t kBytes = std::size_t{8} << 20;
  auto seg = shm::Segment::create("/dopt-" + std::to_string(::getpid()) + "-hugetest", kBytes);
  (void)::madvise(seg->data(), seg->size(), MADV_HUGEPAGE);
  std::memset(seg->data(), 1, seg->size());
  const std::size_t huge = seg->huge_page_bytes();
  CHECK(huge <= seg->size());
  CHECK(huge % (std::size_t{2} << 20) == 0);
  if (const char* e = std::getenv("DOPT_TEST_EXPECT_HUGE_SHM"); e && std::string(e) == "1") {
    CHECK(mode == "always");
    CHECK(huge >= (std::size_t{2} << 20));
  } else if (mode == "never" || mode == "deny") {
    CHECK(huge == 0);
  }
}
