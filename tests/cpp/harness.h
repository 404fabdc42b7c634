// The tests' tiny harness (no dependencies, so it builds under every sanitizer): CHECK records a
// failure and goes on; each case is a function registered with TEST_CASE; run_cases() runs them
// all (or those whose name contains argv[1]), prints one "[ PASS ] name" / "[ FAIL ] name" line
// per case (tests/cpp/run_sanitizers.sh counts these) and returns non-zero if any failed. A
// watchdog thread ends the process if one case runs longer than FASTLOAD_TEST_CASE_TIMEOUT
// seconds (60), so a hang is a failure, not a stuck CI job.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace harness {

inline std::mutex g_print_mutex;
inline std::atomic<int64_t> g_case_failures{0};
inline std::atomic<int64_t> g_checks{0};

inline void fail(const char* file, int line, const std::string& what) {
  const int64_t n = ++g_case_failures;
  std::lock_guard<std::mutex> lock(g_print_mutex);
  if (n <= 25)
    std::printf("    CHECK FAILED at %s:%d: %s\n", file, line, what.c_str());
  else if (n == 26)
    std::printf("    (further failures of this case not shown)\n");
  std::fflush(stdout);
}

struct Case {
  const char* name;
  void (*fn)();
};
inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}
struct Registrar {
  Registrar(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};

// Ends the process when a case overruns its deadline (a deadlock or a lost wake-up).
class Watchdog {
 public:
  explicit Watchdog(int seconds) : seconds_(seconds), thread_([this] { loop(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void arm(const char* name) {
    std::lock_guard<std::mutex> lock(mutex_);
    name_ = name;
    deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(seconds_);
    armed_ = true;
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      if (armed_ && std::chrono::steady_clock::now() > deadline_) {
        std::fprintf(stdout, "[ FAIL ] %s (WATCHDOG: still running after %d s: hang?)\n",
                     name_.c_str(), seconds_);
        std::fflush(stdout);
        std::_Exit(3);
      }
    }
  }
  const int seconds_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::string name_;
  std::chrono::steady_clock::time_point deadline_;
  bool armed_ = false, stop_ = false;
  std::thread thread_;
};

// The body of a test binary's main(); `binary` names it in the last line.
inline int run_cases(int argc, char** argv, const char* binary) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* filter = argc > 1 ? argv[1] : nullptr;
  int timeout_s = 60;
  if (const char* t = std::getenv("FASTLOAD_TEST_CASE_TIMEOUT")) timeout_s = std::max(1, std::atoi(t));
  Watchdog watchdog(timeout_s);
  int passed = 0, failed = 0;
  for (const Case& c : registry()) {
    if (filter && !std::strstr(c.name, filter)) continue;
    std::printf("[ RUN  ] %s\n", c.name);
    g_case_failures = 0;
    watchdog.arm(c.name);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.fn();
    } catch (const std::exception& ex) {
      fail(__FILE__, __LINE__, std::string("unexpected exception: ") + ex.what());
    } catch (...) {
      fail(__FILE__, __LINE__, "unexpected non-standard exception");
    }
    watchdog.disarm();
    const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - t0).count();
    const bool ok = g_case_failures.load() == 0;
    (ok ? passed : failed)++;
    std::printf("[ %s ] %s (%lld ms)\n", ok ? "PASS" : "FAIL", c.name, ms);
  }
  std::printf("%s: %d passed, %d failed (%lld checks)\n", binary, passed, failed,
              static_cast<long long>(g_checks.load()));
  return failed ? 1 : 0;
}

}  // namespace harness

#define TEST_CASE(name)                                            \
  static void name();                                              \
  static ::harness::Registrar name##_registrar(#name, &name);      \
  static void name()

#define CHECK(cond)                                          \
  do {                                                       \
    ++::harness::g_checks;                                   \
    if (!(cond)) ::harness::fail(__FILE__, __LINE__, #cond); \
  } while (0)

#define CHECK_MSG(cond, msg)                                  \
  do {                                                        \
    ++::harness::g_checks;                                    \
    if (!(cond)) {                                            \
      std::ostringstream os_;                                 \
      os_ << #cond << "  [" << msg << "]";                    \
      ::harness::fail(__FILE__, __LINE__, os_.str());         \
    }                                                         \
  } while (0)

// expr must throw ExType whose what() contains substr.
#define CHECK_THROWS(expr, ExType, substr)                                                     \
  do {                                                                                        \
    ++::harness::g_checks;                                                                    \
    std::string got_ = "no exception";                                                        \
    bool ok_ = false;                                                                         \
    try {                                                                                     \
      expr;                                                                                   \
    } catch (const ExType& e_) {                                                              \
      got_ = std::string(#ExType ": ") + e_.what();                                           \
      ok_ = std::string(e_.what()).find(substr) != std::string::npos;                         \
    } catch (const std::exception& e_) {                                                      \
      got_ = std::string("another exception: ") + e_.what();                                  \
    }                                                                                         \
    if (!ok_)                                                                                 \
      ::harness::fail(__FILE__, __LINE__,                                                     \
                      std::string(#expr " should throw " #ExType " containing '") + (substr) + \
                          "', got " + got_);                                                  \
  } while (0)
