// Stand-in for the CUDA driver (libcuda) so fastload's transfer engine runs on machines without a
// GPU, with detectors for the ways a transfer engine misuses the driver. Test-only.
//
// Why it is asynchronous: every created stream is a worker thread that runs its queue in order
// after a random delay, because a synchronous fake hides exactly the races the engine can have.
// Why the race detectors use vector clocks: whether an access is ordered after another must not
// depend on what the random delays did, so a misuse is reported on every run, not on lucky ones.
//
// Built without the CUDA headers on purpose (CI has no toolkit): the few driver types it needs are
// declared below with the values of the real cuda.h. Entry points are reached only through
// cuGetProcAddress(_v2), as fastload does, so only the getters and the fake_cuda_* control
// functions are exported.

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// ---- The slice of the driver ABI this library implements (values as in cuda.h).

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct Context;
struct Stream;
struct Event;
using CUcontext = Context*;  // opaque to callers; never dereferenced before it is validated
using CUstream = Stream*;
using CUevent = Event*;

constexpr CUresult kSuccess = 0;
constexpr CUresult kInvalidValue = 1;
constexpr CUresult kOutOfMemory = 2;
constexpr CUresult kNotInitialized = 3;
constexpr CUresult kDeinitialized = 4;
constexpr CUresult kStubLibrary = 34;
constexpr CUresult kNoDevice = 100;
constexpr CUresult kInvalidDevice = 101;
constexpr CUresult kInvalidContext = 201;
constexpr CUresult kInvalidHandle = 400;
constexpr CUresult kNotFound = 500;
constexpr CUresult kNotReady = 600;
constexpr CUresult kIllegalState = 401;
constexpr CUresult kIllegalAddress = 700;
constexpr CUresult kHostMemoryAlreadyRegistered = 712;
constexpr CUresult kHostMemoryNotRegistered = 713;
constexpr CUresult kCaptureUnsupported = 900;
constexpr CUresult kCaptureInvalidated = 901;
constexpr CUresult kCaptureWrongThread = 908;
constexpr CUresult kUnknown = 999;

constexpr unsigned kStreamNonBlocking = 0x1;
constexpr unsigned kHostAllocPortable = 0x1;
constexpr unsigned kHostAllocFlags = 0x1 | 0x2 | 0x4;  // PORTABLE | DEVICEMAP | WRITECOMBINED
constexpr unsigned kEventFlags = 0x1 | 0x2 | 0x4;      // BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS
constexpr unsigned kEventWaitFlags = 0x1;              // CU_EVENT_WAIT_EXTERNAL
constexpr unsigned kEventDisableTiming = 0x2;
constexpr unsigned kHostRegisterFlags = 0x1 | 0x2 | 0x4 | 0x8;  // PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY
constexpr int kDriverVersion = 12040;
// CUstreamCaptureMode.
constexpr int kCaptureGlobal = 0;
constexpr int kCaptureThreadLocal = 1;
constexpr int kCaptureRelaxed = 2;
// The reserved stream handles: 0 and CU_STREAM_LEGACY name the legacy default stream,
// CU_STREAM_PER_THREAD the calling thread's own default stream.
constexpr uintptr_t kStreamLegacy = 0x1;
constexpr uintptr_t kStreamPerThread = 0x2;
constexpr int kMaxDevices = 64;

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

// What cuGetErrorName / cuGetErrorString report; the codes a transfer engine can meet.
constexpr ErrorText kErrors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current"},
    {216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "context already in use"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {909, "CUDA_ERROR_TIMEOUT", "timeout expired"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

// ---- Configuration (fake_cuda_configure keys; FAKE_CUDA_<KEY> environment defaults).

struct Config {
  long long device_count = 2;
  long long stub = 0;
  long long max_delay_us = 200;
  long long seed = 0x5eed;
  long long abort_on_misuse = 0;
  long long fail_alloc_after = -1;
  long long fail_copy_after = -1;
  long long fail_event_sync_after = -1;
  long long fail_event_record_after = -1;
  long long fail_event_record_on = 0;  // a stream handle whose event records fail (0: none)
  long long total_memory = 16LL << 30;
  // Device memory another allocator of the process holds (PyTorch's cache, say): cuMemAlloc and
  // cuMemGetInfo see that much less on every device.
  long long other_allocator_bytes = 0;
  // What cuDriverGetVersion reports; entry points introduced by a later CUDA are missing.
  long long driver_version = kDriverVersion;
  long long paused = 0;
};

struct ConfigKey {
  const char* name;
  long long Config::*field;
  long long min;
  long long max;
};

constexpr long long kNoMax = (1LL << 62);

constexpr ConfigKey kConfigKeys[] = {
    {"device_count", &Config::device_count, 0, kMaxDevices},
    {"stub", &Config::stub, 0, 1},
    {"max_delay_us", &Config::max_delay_us, 0, 10'000'000},
    {"seed", &Config::seed, -kNoMax, kNoMax},
    {"abort_on_misuse", &Config::abort_on_misuse, 0, 1},
    {"fail_alloc_after", &Config::fail_alloc_after, -1, kNoMax},
    {"fail_copy_after", &Config::fail_copy_after, -1, kNoMax},
    {"fail_event_sync_after", &Config::fail_event_sync_after, -1, kNoMax},
    {"fail_event_record_after", &Config::fail_event_record_after, -1, kNoMax},
    {"fail_event_record_on", &Config::fail_event_record_on, 0, kNoMax},
    {"total_memory", &Config::total_memory, 1, kNoMax},
    {"other_allocator_bytes", &Config::other_allocator_bytes, 0, kNoMax},
    {"driver_version", &Config::driver_version, 2000, 99990},
    {"paused", &Config::paused, 0, 1},
};

const ConfigKey* find_key(const char* name) {
  if (name == nullptr) return nullptr;
  for (const ConfigKey& k : kConfigKeys)
    if (std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

// A countdown for injected failures: N >= 0 lets N more calls succeed, then fails one and
// switches itself off; -1 is off. Called only where the call would otherwise succeed.
bool inject_failure(long long& countdown) {
  if (countdown == 0) {
    countdown = -1;
    return true;
  }
  if (countdown > 0) --countdown;
  return false;
}

// ---- Happens-before bookkeeping.

// A vector clock indexed by timeline (one timeline per stream, ids from 1; 0 is unused).
using Clock = std::vector<uint64_t>;

// One operation on one timeline: the op's sequence number on its stream.
struct Access {
  uint32_t timeline = 0;
  uint64_t tick = 0;
};

uint64_t tick_of(const Clock& c, uint32_t timeline) { return timeline < c.size() ? c[timeline] : 0; }

bool happens_before(const Access& a, const Clock& c) { return a.tick <= tick_of(c, a.timeline); }

void join(Clock& into, const Clock& from) {
  if (from.size() > into.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

// Keeps the latest access per timeline: an earlier one on the same stream is ordered before it,
// so it can never be the one that races.
void note_access(std::vector<Access>& accesses, Access a) {
  for (Access& x : accesses) {
    if (x.timeline == a.timeline) {
      x.tick = std::max(x.tick, a.tick);
      return;
    }
  }
  accesses.push_back(a);
}

// Bytes [key, end) of an allocation: the copy that last wrote them and the copies that read them
// since. Bytes never accessed have no segment.
struct Segment {
  size_t end = 0;
  bool written = false;
  Access write;
  std::vector<Access> reads;
};

using Shadow = std::map<size_t, Segment>;

struct Conflict {
  Access with;
  bool with_write = false;
  size_t offset = 0;
};

// Makes `at` a segment boundary so that a range can be updated segment by segment.
void split_at(Shadow& shadow, size_t at) {
  auto it = shadow.upper_bound(at);
  if (it == shadow.begin()) return;
  --it;
  if (it->first < at && at < it->second.end) {
    Segment tail = it->second;
    it->second.end = at;
    shadow.emplace(at, std::move(tail));
  }
}

std::optional<Conflict> shadow_write(Shadow& shadow, size_t begin, size_t end, Access me,
                                     const Clock& clock) {
  split_at(shadow, begin);
  split_at(shadow, end);
  std::optional<Conflict> conflict;
  auto first = shadow.lower_bound(begin);
  auto last = shadow.lower_bound(end);
  for (auto it = first; it != last && !conflict; ++it) {
    const Segment& seg = it->second;
    if (seg.written && !happens_before(seg.write, clock)) {
      conflict = Conflict{seg.write, true, it->first};
      break;
    }
    for (const Access& r : seg.reads) {
      if (!happens_before(r, clock)) {
        conflict = Conflict{r, false, it->first};
        break;
      }
    }
  }
  shadow.erase(first, last);
  Segment fresh;
  fresh.end = end;
  fresh.written = true;
  fresh.write = me;
  shadow.emplace(begin, std::move(fresh));
  return conflict;
}

std::optional<Conflict> shadow_read(Shadow& shadow, size_t begin, size_t end, Access me,
                                    const Clock& clock) {
  split_at(shadow, begin);
  split_at(shadow, end);
  std::optional<Conflict> conflict;
  size_t pos = begin;
  auto it = shadow.lower_bound(begin);
  while (pos < end) {
    if (it == shadow.end() || it->first > pos) {
      Segment gap;
      gap.end = it == shadow.end() ? end : std::min(end, it->first);
      it = shadow.emplace_hint(it, pos, std::move(gap));
    }
    Segment& seg = it->second;
    if (!conflict && seg.written && !happens_before(seg.write, clock))
      conflict = Conflict{seg.write, true, it->first};
    note_access(seg.reads, me);
    pos = seg.end;
    ++it;
  }
  return conflict;
}

// Cheap enough to run over every copied byte twice (at enqueue and after the copy ran).
uint64_t checksum(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001B3ULL;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ULL;
  return h;
}

// ---- Driver objects. None is ever deleted, so a handle stays unique after it is destroyed and a
// later use of it is always recognised rather than landing on a newer object.

struct Context {
  int device;
};

struct Device {
  Context* primary = nullptr;  // one handle per device for the whole process, as in CUDA
  int refcount = 0;            // the primary context is "destroyed" while this is 0
  // After a fault (a kernel's illegal address, say) every later call in the context fails
  // with it: the error is sticky, as in CUDA, until the process ends.
  CUresult sticky = kSuccess;
  Stream* default_stream = nullptr;  // the legacy default stream
  size_t allocated = 0;
  std::vector<Stream*> streams;  // every stream ever made on the device, default one included
};

// Device or page-locked host memory. Addresses are never handed out twice: a freed block stays
// mapped (inaccessible), so a freed pointer cannot alias a newer allocation.
struct Allocation {
  uintptr_t base = 0;
  size_t size = 0;
  size_t mapped = 0;
  bool pinned = false;      // page-locked host memory (cuMemHostAlloc or cuMemHostRegister)
  bool registered = false;  // cuMemHostRegister: the caller's memory, not mapped here
  int device = 0;
  unsigned flags = 0;
  bool live = true;
  int in_flight = 0;            // queued or running copies that touch it
  std::vector<Access> users;    // latest copy per timeline, for the check at free
  Shadow shadow;                // device memory only
};

// kMark: a timing event's timestamp; kSleep: the stream is busy for a while (a kernel of the
// training step, like torch.cuda._sleep); kFault: a kernel that faults when it runs.
enum class OpKind { kHtoD, kDtoH, kWait, kMark, kSleep, kFault };

struct Op {
  OpKind kind = OpKind::kHtoD;
  uint64_t seq = 0;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  Allocation* host = nullptr;    // pinned side of the copy, if any (in_flight held)
  Allocation* device = nullptr;  // device side of the copy (in_flight held)
  uint64_t source_sum = 0;
  const Stream* wait_for = nullptr;
  uint64_t wait_target = 0;
  Event* mark = nullptr;  // kMark: the event, and which of its records this is
  uint64_t mark_generation = 0;
  long long sleep_us = 0;  // kSleep
  CUresult fault = kSuccess;  // kFault
};

struct Stream {
  uint32_t timeline = 0;
  int device = 0;
  unsigned flags = 0;
  bool is_default = false;     // the legacy default stream
  bool per_thread = false;     // a thread's per-thread default stream
  bool live = true;
  bool stop = false;
  // Stream capture (cuStreamBeginCapture): the mode, -1 when not capturing.
  int capture_mode = -1;
  bool capture_invalidated = false;
  std::thread::id capturer;
  Clock clock;                  // clock[timeline] == enqueued
  std::deque<Op> queue;         // front is running or next; popped when done
  uint64_t enqueued = 0;
  uint64_t completed = 0;
  std::condition_variable wake;  // new work, unpause or stop
  std::thread worker;
  std::mt19937_64 rng;
};

struct Event {
  int device = 0;
  bool live = true;
  bool timing = false;  // created without CU_EVENT_DISABLE_TIMING
  bool recorded = false;
  uint64_t generation = 0;  // records so far; a timestamp belongs to the latest only
  std::chrono::steady_clock::time_point stamp;
  bool stamped = false;
  Stream* stream = nullptr;  // the last record's stream and how much of its queue it covers
  uint64_t target = 0;
  Clock snapshot;
};

struct MisuseLog {
  std::mutex mu;  // leaf lock: taken with Driver::mu held or alone
  long long count = 0;
  std::vector<std::string> messages;
};

constexpr size_t kMaxKeptMessages = 10000;

struct Driver {
  std::mutex mu;                     // guards everything below
  std::condition_variable progress;  // an op completed or the library is shutting down
  Config cfg;
  bool initialized = false;
  bool shutdown = false;
  Clock host;  // what the host has observed complete (one clock for all host threads)
  uint32_t timelines = 0;
  std::array<Device, kMaxDevices> devices;
  std::unordered_set<const Stream*> stream_handles;
  std::vector<Stream*> streams;  // index timeline - 1
  std::unordered_set<const Event*> event_handles;
  std::map<uintptr_t, Allocation*> allocations;  // by base address, freed ones included
  long long live_streams = 0;
  long long live_events = 0;
  long long copies = 0;
  long long device_bytes = 0;
  long long device_allocations = 0;
  long long pinned_bytes = 0;
  long long pinned_allocations = 0;
  long long registered_bytes = 0;
  std::vector<Stream*> capturing;  // streams in capture
  // Calls per entry point: call_names[i] is counted in calls[i] (and in each thread's t_calls[i]).
  std::vector<const char*> call_names;  // found by the name literal's address
  std::vector<long long> calls;
  MisuseLog log;
};

// Leaked on purpose: threads may still call in while the process exits, after static destructors.
Driver& drv() {
  static Driver* d = new Driver;
  return *d;
}

std::atomic<bool> g_used{false};    // cuInit succeeded once in this process
std::atomic<bool> g_forked{false};  // this is a fork() child of a process that used the driver
thread_local Context* t_current = nullptr;
thread_local int t_capture_mode = kCaptureGlobal;  // cuThreadExchangeStreamCaptureMode
thread_local Stream* t_per_thread[kMaxDevices] = {};  // this thread's per-thread default streams
// This thread's calls per entry point, indexed as Driver::calls. A plain array: a thread_local with
// a destructor would keep the library from ever being unloaded.
constexpr int kMaxCountedCalls = 128;
thread_local long long t_calls[kMaxCountedCalls] = {};

using Lock = std::unique_lock<std::mutex>;

// Records a misuse. Called with Driver::mu held (it reads the abort switch).
__attribute__((format(printf, 1, 2))) void misuse(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "fake_libcuda MISUSE: %s\n", buf);
  Driver& d = drv();
  {
    std::lock_guard<std::mutex> g(d.log.mu);
    ++d.log.count;
    if (d.log.messages.size() < kMaxKeptMessages) d.log.messages.emplace_back(buf);
  }
  if (d.cfg.abort_on_misuse) {
    std::fflush(stderr);
    std::abort();
  }
}

std::string describe_timeline(uint32_t timeline) {
  Driver& d = drv();
  char buf[96];
  if (timeline == 0 || timeline > d.streams.size()) return "an unknown stream";
  const Stream* s = d.streams[timeline - 1];
  if (s->is_default)
    std::snprintf(buf, sizeof buf, "the default stream of device %d", s->device);
  else if (s->per_thread)
    std::snprintf(buf, sizeof buf, "a per-thread default stream %p (device %d)", static_cast<const void*>(s),
                  s->device);
  else
    std::snprintf(buf, sizeof buf, "stream %p (device %d)", static_cast<const void*>(s), s->device);
  return buf;
}

std::string describe_stream(const Stream* s) { return describe_timeline(s->timeline); }

// Implicit synchronisation points: allocations, frees and page-locking (which may wait for the
// device), context and stream synchronisation, synchronous copies. A loader's steady state makes
// none (waiting for one of its own events is not one of these).
bool is_implicit_sync(const char* fn) {
  static const char* const kSyncs[] = {
      "cuMemAlloc",        "cuMemFree",           "cuMemHostAlloc",      "cuMemFreeHost",       "cuMemHostRegister",
      "cuMemHostUnregister", "cuCtxSynchronize",  "cuStreamSynchronize", "cuMemcpyDtoH",
  };
  for (const char* u : kSyncs)
    if (std::strcmp(u, fn) == 0) return true;
  return false;
}

// The calls that may synchronise or allocate, event and stream queries included: during a stream
// capture in global mode they are "potentially unsafe" and fail (see check_capture).
bool is_unsafe_during_capture(const char* fn) {
  return is_implicit_sync(fn) || std::strcmp(fn, "cuEventQuery") == 0 ||
         std::strcmp(fn, "cuEventSynchronize") == 0 || std::strcmp(fn, "cuStreamQuery") == 0;
}

// Calls that still work in a context whose error is sticky (they do not touch the context).
bool ignores_sticky_error(const char* fn) {
  static const char* const kFree[] = {
      "cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName", "cuDevicePrimaryCtxRetain",
      "cuDevicePrimaryCtxRelease", "cuCtxSetCurrent", "cuCtxGetCurrent", "cuThreadExchangeStreamCaptureMode",
  };
  for (const char* u : kFree)
    if (std::strcmp(u, fn) == 0) return true;
  return false;
}

// During a capture, a potentially unsafe call is refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
// and invalidates the capture it would disturb, unless this thread's mode allows it: relaxed
// allows everything; thread-local refuses only during this thread's own capture; global (every
// thread's default) also during another thread's global-mode capture. As in CUDA; the refusal is
// also reported as a misuse, since a loader's threads must never break their user's capture.
CUresult check_capture(Driver& d, const char* fn) {
  if (d.capturing.empty() || t_capture_mode == kCaptureRelaxed) return kSuccess;
  const std::thread::id me = std::this_thread::get_id();
  Stream* broken = nullptr;
  for (Stream* s : d.capturing) {
    const bool prohibits = s->capturer == me ? s->capture_mode != kCaptureRelaxed
                                             : t_capture_mode == kCaptureGlobal && s->capture_mode == kCaptureGlobal;
    if (!prohibits) continue;
    s->capture_invalidated = true;
    broken = s;
  }
  if (broken == nullptr) return kSuccess;
  misuse("%s during a stream capture: refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the capture "
         "on %s is invalidated (a thread must switch to relaxed mode with cuThreadExchangeStreamCaptureMode "
         "before calls that may synchronise or allocate)",
         fn, describe_stream(broken).c_str());
  return kCaptureUnsupported;
}

// (A linear search by address: a hash map here would bring in a symbol that keeps the library
// from being unloaded.)
void count_call(Driver& d, const char* fn) {
  size_t i = 0;
  while (i < d.call_names.size() && d.call_names[i] != fn) ++i;
  if (i == d.call_names.size()) {
    if (i >= static_cast<size_t>(kMaxCountedCalls)) return;
    d.call_names.push_back(fn);
    d.calls.push_back(0);
  }
  ++d.calls[i];
  ++t_calls[i];
}

// Runs one driver call: refuses it in a forked child, after shutdown, or before cuInit, counts it,
// refuses it when it would break a stream capture or the calling thread's context has a sticky
// error, and keeps exceptions from crossing the C boundary.
template <class F>
CUresult api(const char* fn, bool needs_init, F&& body) {
  if (g_forked.load(std::memory_order_relaxed)) return kNotInitialized;
  try {
    Driver& d = drv();
    Lock lk(d.mu);
    if (d.shutdown) return kDeinitialized;
    count_call(d, fn);
    if (needs_init && !d.initialized) return kNotInitialized;
    if (t_current != nullptr && !ignores_sticky_error(fn) && d.devices[t_current->device].sticky != kSuccess)
      return d.devices[t_current->device].sticky;
    if (is_unsafe_during_capture(fn)) {
      const CUresult refused = check_capture(d, fn);
      if (refused != kSuccess) return refused;
    }
    return body(lk);
  } catch (const std::bad_alloc&) {
    return kOutOfMemory;
  } catch (...) {
    return kUnknown;
  }
}

// ---- Memory mapping.

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

void* map_block(size_t bytes, size_t* mapped) {
  size_t page = page_size();
  if (bytes > SIZE_MAX - page) return nullptr;
  *mapped = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Gives the pages back but keeps the addresses reserved, so they are never reused.
void retire_block(Allocation* a) {
  mmap(reinterpret_cast<void*>(a->base), a->mapped, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

// The allocation whose mapped block holds `p`, live or freed.
Allocation* find_allocation(Driver& d, uintptr_t p) {
  auto& m = d.allocations;
  auto it = m.upper_bound(p);
  if (it == m.begin()) return nullptr;
  --it;
  Allocation* a = it->second;
  return p - a->base < a->mapped ? a : nullptr;
}

bool range_inside(const Allocation& a, uintptr_t p, size_t n) {
  return p >= a.base && n <= a.size && p - a.base <= a.size - n;
}

// ---- Streams.

void finish_op(Driver& d, Stream* s) {
  Op& op = s->queue.front();
  if (op.host) --op.host->in_flight;
  if (op.device) --op.device->in_flight;
  s->completed = op.seq;
  s->queue.pop_front();
  d.progress.notify_all();
}

void run_stream(Stream* s) {
  Driver& d = drv();
  Lock lk(d.mu);
  for (;;) {
    s->wake.wait(lk, [&] { return s->stop || (!s->queue.empty() && !d.cfg.paused); });
    if (s->stop) return;
    Op& op = s->queue.front();  // deque references survive push_back by enqueuing threads
    if (op.kind == OpKind::kWait) {
      d.progress.wait(lk, [&] { return s->stop || op.wait_for->completed >= op.wait_target; });
      if (s->stop) return;
      finish_op(d, s);
      continue;
    }
    if (op.kind == OpKind::kMark) {  // a timestamp is taken when the stream gets there, no delay
      if (op.mark->generation == op.mark_generation) {
        op.mark->stamp = std::chrono::steady_clock::now();
        op.mark->stamped = true;
      }
      finish_op(d, s);
      continue;
    }
    if (op.kind == OpKind::kSleep) {
      if (s->wake.wait_for(lk, std::chrono::microseconds(op.sleep_us), [&] { return s->stop; })) return;
      finish_op(d, s);
      continue;
    }
    if (op.kind == OpKind::kFault) {  // the kernel faults: the context's error is sticky from now on
      Device& device = d.devices[s->device];
      if (device.sticky == kSuccess) device.sticky = op.fault;
      finish_op(d, s);
      continue;
    }
    long long max_delay = d.cfg.max_delay_us;
    if (max_delay > 0) {
      auto delay = std::chrono::microseconds(s->rng() % static_cast<uint64_t>(max_delay + 1));
      if (s->wake.wait_for(lk, delay, [&] { return s->stop; })) return;
      if (d.cfg.paused) continue;  // paused during the delay: nothing may start now
    }
    lk.unlock();
    // The memory stays mapped: frees wait for in_flight to drop to zero.
    std::memcpy(op.dst, op.src, op.bytes);
    uint64_t copied_sum = op.kind == OpKind::kHtoD ? checksum(op.dst, op.bytes) : 0;
    lk.lock();
    if (op.kind == OpKind::kHtoD) {
      ++d.copies;
      if (copied_sum != op.source_sum)
        misuse("pinned source rewritten before its copy ran (cuMemcpyHtoDAsync of %zu bytes from %p "
               "to 0x%llx on %s)",
               op.bytes, op.src, static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(op.dst)),
               describe_stream(s).c_str());
    }
    finish_op(d, s);
  }
}

// May throw (std::system_error if the thread cannot start); the caller maps that to an error.
Stream* new_stream(Driver& d, int device, unsigned flags, bool is_default, bool per_thread = false) {
  auto* s = new Stream;
  s->timeline = d.timelines + 1;
  s->device = device;
  s->flags = flags;
  s->is_default = is_default;
  s->per_thread = per_thread;
  s->clock.assign(s->timeline + 1, 0);
  s->rng.seed(static_cast<uint64_t>(d.cfg.seed) * 0x9E3779B97F4A7C15ULL + s->timeline);
  try {
    s->worker = std::thread(run_stream, s);
  } catch (...) {
    delete s;
    throw;
  }
  d.timelines = s->timeline;
  d.streams.push_back(s);
  d.stream_handles.insert(s);
  d.devices[device].streams.push_back(s);
  return s;
}

// The device of the calling thread's current context, or -1 (with *err set) if there is none.
int current_device(Driver& d, const char* fn, CUresult* err) {
  Context* c = t_current;
  if (c == nullptr) {
    misuse("no current context (%s called on a thread without cuCtxSetCurrent)", fn);
    *err = kInvalidContext;
    return -1;
  }
  if (d.devices[c->device].refcount == 0) {
    misuse("handle used after destroy: %s with current context %p, a primary context released by "
           "cuDevicePrimaryCtxRelease",
           fn, static_cast<void*>(c));
    *err = kInvalidContext;
    return -1;
  }
  return c->device;
}

bool is_default_handle(CUstream h) { return reinterpret_cast<uintptr_t>(h) <= kStreamPerThread; }

// The legacy default stream of a device (made on first use).
Stream* legacy_stream(Driver& d, int dev) {
  Device& device = d.devices[dev];
  if (device.default_stream == nullptr) device.default_stream = new_stream(d, dev, 0, true);
  return device.default_stream;
}

// Handle 0 and 0x1 (CU_STREAM_LEGACY) name the device's legacy default stream; 0x2
// (CU_STREAM_PER_THREAD) the calling thread's own default stream, a different one on every
// thread. Both are blocking streams: see implicit_sync for how they order work.
Stream* resolve_stream(Driver& d, CUstream h, const char* fn, CUresult* err) {
  if (is_default_handle(h)) {
    int dev = current_device(d, fn, err);
    if (dev < 0) return nullptr;
    if (reinterpret_cast<uintptr_t>(h) != kStreamPerThread) return legacy_stream(d, dev);
    if (t_per_thread[dev] == nullptr) t_per_thread[dev] = new_stream(d, dev, 0, false, true);
    return t_per_thread[dev];
  }
  if (d.stream_handles.count(h) == 0) {
    misuse("invalid stream handle %p passed to %s", static_cast<void*>(h), fn);
    *err = kInvalidHandle;
    return nullptr;
  }
  if (!h->live) {
    misuse("handle used after destroy: %s on stream %p, destroyed by cuStreamDestroy", fn,
           static_cast<void*>(h));
    *err = kInvalidHandle;
    return nullptr;
  }
  if (d.devices[h->device].sticky != kSuccess) {  // a stream of a faulted context, from any thread
    *err = d.devices[h->device].sticky;
    return nullptr;
  }
  return h;
}

Event* resolve_event(Driver& d, CUevent h, const char* fn, CUresult* err) {
  if (d.event_handles.count(h) == 0) {
    misuse("invalid event handle %p passed to %s", static_cast<void*>(h), fn);
    *err = kInvalidHandle;
    return nullptr;
  }
  if (!h->live) {
    misuse("handle used after destroy: %s on event %p, destroyed by cuEventDestroy", fn,
           static_cast<void*>(h));
    *err = kInvalidHandle;
    return nullptr;
  }
  if (d.devices[h->device].sticky != kSuccess) {
    *err = d.devices[h->device].sticky;
    return nullptr;
  }
  return h;
}

// Starts a new op on `s`: it comes after everything the host has seen complete.
Access advance(Driver& d, Stream* s) {
  join(s->clock, d.host);
  s->clock[s->timeline] = ++s->enqueued;
  return Access{s->timeline, s->enqueued};
}

void push_op(Stream* s, Op op) {
  if (op.host) ++op.host->in_flight;
  if (op.device) ++op.device->in_flight;
  s->queue.push_back(op);
  s->wake.notify_one();
}

// Makes the next op on `s` run after every op enqueued on `on` so far.
void order_after(Driver& d, Stream* s, const Stream* on) {
  if (on->enqueued == 0 || tick_of(s->clock, on->timeline) >= on->enqueued) return;
  join(s->clock, on->clock);
  if (on->completed >= on->enqueued) return;
  Op op;
  op.kind = OpKind::kWait;
  op.seq = advance(d, s).tick;
  op.wait_for = on;
  op.wait_target = on->enqueued;
  push_op(s, op);
}

// The implicit synchronisation of blocking streams (created without CU_STREAM_NON_BLOCKING, and
// the per-thread default streams) with the legacy default stream, as in CUDA: work on the legacy
// stream waits for all work enqueued before it on every blocking stream of the context, and work
// on a blocking stream waits for all work enqueued before it on the legacy stream. Called before
// anything is enqueued on `s`. Non-blocking streams take no part.
void implicit_sync(Driver& d, Stream* s) {
  if (s->flags & kStreamNonBlocking) return;
  Device& device = d.devices[s->device];
  if (s->is_default) {
    for (const Stream* b : device.streams)
      if (b != s && b->live && !(b->flags & kStreamNonBlocking)) order_after(d, s, b);
  } else if (device.default_stream != nullptr) {
    order_after(d, s, device.default_stream);
  }
}

// Work enqueued on a stream in capture is recorded into the user's graph, not run; the stand-in
// keeps no graph, so it drops that work (and the caller's call succeeds).
bool captured(const Stream* s) { return s->capture_mode >= 0; }

// Waits until `s` has completed `target` ops; false if the library shut down meanwhile.
bool wait_for_ops(Driver& d, Lock& lk, const Stream* s, uint64_t target) {
  d.progress.wait(lk, [&] { return d.shutdown || s->completed >= target; });
  return !d.shutdown;
}

// ---- Entry points.

CUresult fake_cuGetErrorString(CUresult error, const char** str) {
  if (str == nullptr) return kInvalidValue;
  for (const ErrorText& e : kErrors) {
    if (e.code == error) {
      *str = e.text;
      return kSuccess;
    }
  }
  *str = nullptr;
  return kInvalidValue;
}

CUresult fake_cuGetErrorName(CUresult error, const char** str) {
  if (str == nullptr) return kInvalidValue;
  for (const ErrorText& e : kErrors) {
    if (e.code == error) {
      *str = e.name;
      return kSuccess;
    }
  }
  *str = nullptr;
  return kInvalidValue;
}

CUresult fake_cuInit(unsigned flags) {
  return api("cuInit", false, [&](Lock&) -> CUresult {
    Driver& d = drv();
    if (flags != 0) return kInvalidValue;
    if (d.cfg.stub) return kStubLibrary;
    if (d.cfg.device_count == 0) return kNoDevice;
    d.initialized = true;
    g_used.store(true);
    return kSuccess;
  });
}

CUresult fake_cuDriverGetVersion(int* version) {
  if (version == nullptr) return kInvalidValue;
  Driver& d = drv();
  Lock lk(d.mu);
  *version = static_cast<int>(d.cfg.driver_version);
  return kSuccess;
}

CUresult fake_cuDeviceGetCount(int* count) {
  return api("cuDeviceGetCount", true, [&](Lock&) -> CUresult {
    if (count == nullptr) return kInvalidValue;
    *count = static_cast<int>(drv().cfg.device_count);
    return kSuccess;
  });
}

bool valid_device(CUdevice dev) { return dev >= 0 && dev < drv().cfg.device_count; }

CUresult fake_cuDeviceGet(CUdevice* device, int ordinal) {
  return api("cuDeviceGet", true, [&](Lock&) -> CUresult {
    if (device == nullptr) return kInvalidValue;
    if (!valid_device(ordinal)) return kInvalidDevice;
    *device = ordinal;
    return kSuccess;
  });
}

CUresult fake_cuDeviceGetName(char* name, int len, CUdevice dev) {
  return api("cuDeviceGetName", true, [&](Lock&) -> CUresult {
    if (name == nullptr || len <= 0) return kInvalidValue;
    if (!valid_device(dev)) return kInvalidDevice;
    std::snprintf(name, static_cast<size_t>(len), "fastload fake CUDA device %d", dev);
    return kSuccess;
  });
}

CUresult fake_cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  return api("cuDevicePrimaryCtxRetain", true, [&](Lock&) -> CUresult {
    if (ctx == nullptr) return kInvalidValue;
    if (!valid_device(dev)) return kInvalidDevice;
    Device& device = drv().devices[dev];
    if (device.primary == nullptr) device.primary = new Context{dev};
    ++device.refcount;
    *ctx = device.primary;
    return kSuccess;
  });
}

CUresult fake_cuDevicePrimaryCtxRelease(CUdevice dev) {
  return api("cuDevicePrimaryCtxRelease", true, [&](Lock&) -> CUresult {
    if (!valid_device(dev)) return kInvalidDevice;
    Device& device = drv().devices[dev];
    if (device.refcount == 0) {
      misuse("handle used after destroy: cuDevicePrimaryCtxRelease of device %d, whose primary "
             "context is not retained",
             dev);
      return kInvalidContext;
    }
    --device.refcount;
    return kSuccess;
  });
}

CUresult fake_cuCtxSetCurrent(CUcontext ctx) {
  return api("cuCtxSetCurrent", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    if (ctx == nullptr) {
      t_current = nullptr;
      return kSuccess;
    }
    for (Device& device : d.devices) {
      if (device.primary != ctx) continue;
      if (device.refcount == 0) {
        misuse("handle used after destroy: cuCtxSetCurrent(%p), a primary context released by "
               "cuDevicePrimaryCtxRelease",
               static_cast<void*>(ctx));
        return kInvalidContext;
      }
      t_current = ctx;
      return kSuccess;
    }
    misuse("invalid context handle %p passed to cuCtxSetCurrent", static_cast<void*>(ctx));
    return kInvalidContext;
  });
}

CUresult fake_cuCtxGetCurrent(CUcontext* ctx) {
  return api("cuCtxGetCurrent", true, [&](Lock&) -> CUresult {
    if (ctx == nullptr) return kInvalidValue;
    *ctx = t_current;
    return kSuccess;
  });
}

CUresult fake_cuCtxSynchronize() {
  return api("cuCtxSynchronize", true, [&](Lock& lk) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    int dev = current_device(d, "cuCtxSynchronize", &err);
    if (dev < 0) return err;
    // Only the work queued before the call: what other threads add meanwhile is not covered.
    std::vector<std::pair<const Stream*, uint64_t>> targets;
    Clock seen;
    for (const Stream* s : d.devices[dev].streams) {
      targets.emplace_back(s, s->enqueued);
      join(seen, s->clock);
    }
    for (auto& [s, target] : targets)
      if (!wait_for_ops(d, lk, s, target)) return kDeinitialized;
    join(d.host, seen);
    return kSuccess;
  });
}

CUresult fake_cuStreamCreate(CUstream* stream, unsigned flags) {
  return api("cuStreamCreate", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    int dev = current_device(d, "cuStreamCreate", &err);
    if (dev < 0) return err;
    if (stream == nullptr || (flags & ~kStreamNonBlocking) != 0) return kInvalidValue;
    Stream* s;
    try {
      s = new_stream(d, dev, flags, false);
    } catch (const std::system_error&) {
      return kOutOfMemory;
    }
    ++d.live_streams;
    *stream = s;
    return kSuccess;
  });
}

CUresult fake_cuStreamDestroy(CUstream h) {
  return api("cuStreamDestroy", true, [&](Lock& lk) -> CUresult {
    Driver& d = drv();
    if (is_default_handle(h)) {
      misuse("cuStreamDestroy of a default stream handle (%p)", static_cast<void*>(h));
      return kInvalidHandle;
    }
    CUresult err = kSuccess;
    Stream* s = resolve_stream(d, h, "cuStreamDestroy", &err);
    if (s == nullptr) return err;
    // Judged by what the host has observed, not by timing: work the host never waited for is
    // outstanding even if the worker happens to have finished it.
    if (!s->queue.empty() || tick_of(d.host, s->timeline) < s->enqueued)
      misuse("stream not idle at destroy: %s has work the host never waited for (%llu ops "
             "enqueued in all, %zu not yet run)",
             describe_stream(s).c_str(), static_cast<unsigned long long>(s->enqueued),
             s->queue.size());
    s->live = false;
    --d.live_streams;
    if (!wait_for_ops(d, lk, s, s->enqueued)) return kDeinitialized;
    s->stop = true;
    s->wake.notify_all();
    std::thread worker = std::move(s->worker);
    lk.unlock();
    if (worker.joinable()) worker.join();
    return kSuccess;
  });
}

CUresult fake_cuStreamWaitEvent(CUstream hs, CUevent he, unsigned flags) {
  return api("cuStreamWaitEvent", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    Stream* s = resolve_stream(d, hs, "cuStreamWaitEvent", &err);
    if (s == nullptr) return err;
    Event* e = resolve_event(d, he, "cuStreamWaitEvent", &err);
    if (e == nullptr) return err;
    if ((flags & ~kEventWaitFlags) != 0) return kInvalidValue;
    if (!e->recorded) return kSuccess;  // as in CUDA: waiting on a never-recorded event is a no-op
    if (captured(s)) return kSuccess;
    implicit_sync(d, s);
    join(s->clock, e->snapshot);
    if (e->stream == s || e->stream->completed >= e->target) return kSuccess;
    Op op;
    op.kind = OpKind::kWait;
    op.seq = advance(d, s).tick;
    op.wait_for = e->stream;
    op.wait_target = e->target;
    push_op(s, op);
    return kSuccess;
  });
}

CUresult fake_cuStreamSynchronize(CUstream hs) {
  return api("cuStreamSynchronize", true, [&](Lock& lk) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    Stream* s = resolve_stream(d, hs, "cuStreamSynchronize", &err);
    if (s == nullptr) return err;
    Clock seen = s->clock;
    if (!wait_for_ops(d, lk, s, s->enqueued)) return kDeinitialized;
    join(d.host, seen);
    return kSuccess;
  });
}

CUresult fake_cuStreamQuery(CUstream hs) {
  return api("cuStreamQuery", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    Stream* s = resolve_stream(d, hs, "cuStreamQuery", &err);
    if (s == nullptr) return err;
    if (s->completed < s->enqueued) return kNotReady;
    join(d.host, s->clock);
    return kSuccess;
  });
}

CUresult fake_cuEventCreate(CUevent* event, unsigned flags) {
  return api("cuEventCreate", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    int dev = current_device(d, "cuEventCreate", &err);
    if (dev < 0) return err;
    if (event == nullptr || (flags & ~kEventFlags) != 0) return kInvalidValue;
    auto* e = new Event;
    e->device = dev;
    e->timing = !(flags & kEventDisableTiming);
    d.event_handles.insert(e);
    ++d.live_events;
    *event = e;
    return kSuccess;
  });
}

CUresult fake_cuEventRecord(CUevent he, CUstream hs) {
  return api("cuEventRecord", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    Event* e = resolve_event(d, he, "cuEventRecord", &err);
    if (e == nullptr) return err;
    Stream* s = resolve_stream(d, hs, "cuEventRecord", &err);
    if (s == nullptr) return err;
    if (s->device != e->device) {
      misuse("cuEventRecord of event %p (device %d) on %s: event and stream belong to different "
             "contexts",
             static_cast<void*>(e), e->device, describe_stream(s).c_str());
      return kInvalidHandle;
    }
    if (inject_failure(d.cfg.fail_event_record_after)) return kOutOfMemory;  // not sticky
    if (d.cfg.fail_event_record_on != 0 && reinterpret_cast<uintptr_t>(hs) == static_cast<uintptr_t>(d.cfg.fail_event_record_on))
      return kOutOfMemory;
    if (captured(s)) return kSuccess;
    implicit_sync(d, s);
    e->recorded = true;
    e->stream = s;
    ++e->generation;
    e->stamped = false;
    if (e->timing) {  // a timestamp op, taken when the stream reaches it
      Op op;
      op.kind = OpKind::kMark;
      op.seq = advance(d, s).tick;
      op.mark = e;
      op.mark_generation = e->generation;
      push_op(s, op);
    }
    e->target = s->enqueued;
    e->snapshot = s->clock;
    return kSuccess;
  });
}

// Shared by cuEventSynchronize and cuEventQuery once the event's work is known complete. The
// injected failure stands for a kernel that faulted before the event: sticky, as in CUDA.
CUresult event_completed(Driver& d, int device, const Clock& snapshot) {
  if (inject_failure(d.cfg.fail_event_sync_after)) {
    d.devices[device].sticky = kIllegalAddress;
    return kIllegalAddress;
  }
  join(d.host, snapshot);
  return kSuccess;
}

CUresult fake_cuEventQuery(CUevent he) {
  return api("cuEventQuery", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    Event* e = resolve_event(d, he, "cuEventQuery", &err);
    if (e == nullptr) return err;
    if (e->recorded && e->stream->completed < e->target) return kNotReady;
    return event_completed(d, e->device, e->snapshot);
  });
}

CUresult fake_cuEventSynchronize(CUevent he) {
  return api("cuEventSynchronize", true, [&](Lock& lk) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    Event* e = resolve_event(d, he, "cuEventSynchronize", &err);
    if (e == nullptr) return err;
    if (!e->recorded) return event_completed(d, e->device, Clock{});
    // Copied: another thread may re-record or destroy the event while this one waits.
    const Stream* s = e->stream;
    uint64_t target = e->target;
    Clock snapshot = e->snapshot;
    const int device = e->device;
    if (!wait_for_ops(d, lk, s, target)) return kDeinitialized;
    if (d.devices[device].sticky != kSuccess) return d.devices[device].sticky;  // faulted meanwhile
    return event_completed(d, device, snapshot);
  });
}

CUresult fake_cuEventElapsedTime(float* ms, CUevent hstart, CUevent hend) {
  return api("cuEventElapsedTime", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    Event* a = resolve_event(d, hstart, "cuEventElapsedTime", &err);
    if (a == nullptr) return err;
    Event* b = resolve_event(d, hend, "cuEventElapsedTime", &err);
    if (b == nullptr) return err;
    if (ms == nullptr) return kInvalidValue;
    if (!a->timing || !b->timing || !a->recorded || !b->recorded) return kInvalidHandle;
    if (a->stream->completed < a->target || b->stream->completed < b->target) return kNotReady;
    if (!a->stamped || !b->stamped) return kNotReady;
    *ms = std::chrono::duration<float, std::milli>(b->stamp - a->stamp).count();
    return kSuccess;
  });
}

CUresult fake_cuEventDestroy(CUevent he) {
  return api("cuEventDestroy", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    Event* e = resolve_event(d, he, "cuEventDestroy", &err);
    if (e == nullptr) return err;
    e->live = false;
    --d.live_events;
    return kSuccess;
  });
}

CUresult allocate(Driver& d, size_t bytes, bool pinned, int device, unsigned flags, void** out) {
  size_t mapped = 0;
  void* p = map_block(bytes, &mapped);
  if (p == nullptr) return kOutOfMemory;
  auto* a = new Allocation;
  a->base = reinterpret_cast<uintptr_t>(p);
  a->size = bytes;
  a->mapped = mapped;
  a->pinned = pinned;
  a->device = device;
  a->flags = flags;
  d.allocations[a->base] = a;
  if (pinned) {
    d.pinned_bytes += static_cast<long long>(bytes);
    ++d.pinned_allocations;
  } else {
    d.devices[device].allocated += bytes;
    d.device_bytes += static_cast<long long>(bytes);
    ++d.device_allocations;
  }
  *out = p;
  return kSuccess;
}

CUresult fake_cuMemAlloc(CUdeviceptr* dptr, size_t bytes) {
  return api("cuMemAlloc", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    int dev = current_device(d, "cuMemAlloc", &err);
    if (dev < 0) return err;
    if (dptr == nullptr || bytes == 0) return kInvalidValue;
    size_t total = static_cast<size_t>(d.cfg.total_memory);
    size_t used = d.devices[dev].allocated + static_cast<size_t>(d.cfg.other_allocator_bytes);
    if (used > total || bytes > total - used) return kOutOfMemory;
    if (inject_failure(d.cfg.fail_alloc_after)) return kOutOfMemory;
    void* p = nullptr;
    CUresult rc = allocate(d, bytes, false, dev, 0, &p);
    if (rc == kSuccess) *dptr = reinterpret_cast<uintptr_t>(p);
    return rc;
  });
}

CUresult fake_cuMemHostAlloc(void** pp, size_t bytes, unsigned flags) {
  return api("cuMemHostAlloc", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    int dev = current_device(d, "cuMemHostAlloc", &err);
    if (dev < 0) return err;
    if (pp == nullptr || bytes == 0 || (flags & ~kHostAllocFlags) != 0) return kInvalidValue;
    if (inject_failure(d.cfg.fail_alloc_after)) return kOutOfMemory;
    return allocate(d, bytes, true, dev, flags, pp);
  });
}

// Frees `a` once no queued copy uses it. A copy the host never waited for is reported whether or
// not it has run yet, so the verdict does not depend on timing.
CUresult release(Driver& d, Lock& lk, Allocation* a, const char* fn) {
  const Access* unsynced = nullptr;
  for (const Access& u : a->users)
    if (!happens_before(u, d.host)) unsynced = &u;
  if (a->in_flight > 0 || unsynced != nullptr)
    misuse("freed while in use by a queued copy: %s(%p) while a copy on %s was not waited for",
           fn, reinterpret_cast<void*>(a->base),
           unsynced ? describe_timeline(unsynced->timeline).c_str() : "a stream");
  a->live = false;
  if (a->pinned) {
    d.pinned_bytes -= static_cast<long long>(a->size);
    --d.pinned_allocations;
  } else {
    d.devices[a->device].allocated -= a->size;
    d.device_bytes -= static_cast<long long>(a->size);
    --d.device_allocations;
  }
  d.progress.wait(lk, [&] { return d.shutdown || a->in_flight == 0; });
  if (d.shutdown) return kDeinitialized;
  retire_block(a);
  a->users.clear();
  a->shadow.clear();
  return kSuccess;
}

// The live allocation starting exactly at `p`, or nullptr after reporting why not.
Allocation* allocation_to_free(Driver& d, uintptr_t p, bool pinned, const char* fn) {
  const char* wanted = pinned ? "cuMemHostAlloc" : "cuMemAlloc";
  Allocation* a = find_allocation(d, p);
  if (a == nullptr || a->base != p) {
    if (a != nullptr && !a->live)
      misuse("handle used after destroy: %s(0x%llx) inside a block already freed", fn,
             static_cast<unsigned long long>(p));
    else
      misuse("%s(0x%llx) of a pointer that %s did not return", fn, static_cast<unsigned long long>(p),
             wanted);
    return nullptr;
  }
  if (a->pinned != pinned || a->registered) {
    misuse("%s(0x%llx) of memory from %s", fn, static_cast<unsigned long long>(p),
           a->registered ? "cuMemHostRegister" : pinned ? "cuMemAlloc" : "cuMemHostAlloc");
    return nullptr;
  }
  if (!a->live) {
    misuse("handle used after destroy: double free, %s(0x%llx)", fn, static_cast<unsigned long long>(p));
    return nullptr;
  }
  return a;
}

CUresult fake_cuMemFree(CUdeviceptr dptr) {
  return api("cuMemFree", true, [&](Lock& lk) -> CUresult {
    Driver& d = drv();
    if (dptr == 0) return kSuccess;
    Allocation* a = allocation_to_free(d, static_cast<uintptr_t>(dptr), false, "cuMemFree");
    if (a == nullptr) return kInvalidValue;
    return release(d, lk, a, "cuMemFree");
  });
}

CUresult fake_cuMemFreeHost(void* p) {
  return api("cuMemFreeHost", true, [&](Lock& lk) -> CUresult {
    Driver& d = drv();
    if (p == nullptr) return kSuccess;
    Allocation* a = allocation_to_free(d, reinterpret_cast<uintptr_t>(p), true, "cuMemFreeHost");
    if (a == nullptr) return kInvalidValue;
    return release(d, lk, a, "cuMemFreeHost");
  });
}

// Page-locks the caller's own memory (memory it mapped; the stand-in neither maps nor unmaps it).
CUresult fake_cuMemHostRegister(void* p, size_t bytes, unsigned flags) {
  return api("cuMemHostRegister", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    int dev = current_device(d, "cuMemHostRegister", &err);
    if (dev < 0) return err;
    if (p == nullptr || bytes == 0 || (flags & ~kHostRegisterFlags) != 0) return kInvalidValue;
    const uintptr_t base = reinterpret_cast<uintptr_t>(p);
    if (base > UINTPTR_MAX - bytes) return kInvalidValue;
    // Overlapping a live registration or allocation: refused, as CUDA does.
    auto it = d.allocations.lower_bound(base + bytes);
    if (it != d.allocations.begin()) {
      --it;
      const Allocation* a = it->second;
      if (a->live && a->base + a->mapped > base) return kHostMemoryAlreadyRegistered;
    }
    auto* a = new Allocation;
    a->base = base;
    a->size = bytes;
    a->mapped = bytes;
    a->pinned = true;
    a->registered = true;
    a->device = dev;
    a->flags = flags;
    // A freed registration at this address is forgotten: host memory may be mapped there again.
    d.allocations.insert_or_assign(base, a);
    d.registered_bytes += static_cast<long long>(bytes);
    return kSuccess;
  });
}

CUresult fake_cuMemHostUnregister(void* p) {
  return api("cuMemHostUnregister", true, [&](Lock& lk) -> CUresult {
    Driver& d = drv();
    const uintptr_t base = reinterpret_cast<uintptr_t>(p);
    auto it = d.allocations.find(base);
    if (it == d.allocations.end() || !it->second->registered || !it->second->live) {
      misuse("cuMemHostUnregister(%p) of memory that cuMemHostRegister did not page-lock", p);
      return kHostMemoryNotRegistered;
    }
    Allocation* a = it->second;
    const Access* unsynced = nullptr;
    for (const Access& u : a->users)
      if (!happens_before(u, d.host)) unsynced = &u;
    if (a->in_flight > 0 || unsynced != nullptr)
      misuse("unregistered while in use by a queued copy: cuMemHostUnregister(%p) while a copy on %s was not "
             "waited for",
             p, unsynced ? describe_timeline(unsynced->timeline).c_str() : "a stream");
    a->live = false;
    d.registered_bytes -= static_cast<long long>(a->size);
    d.progress.wait(lk, [&] { return d.shutdown || a->in_flight == 0; });
    if (d.shutdown) return kDeinitialized;
    d.allocations.erase(it);  // the Allocation itself is leaked: finished ops may still name it
    return kSuccess;
  });
}

CUresult fake_cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  return api("cuMemGetInfo", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    int dev = current_device(d, "cuMemGetInfo", &err);
    if (dev < 0) return err;
    if (free_bytes == nullptr || total_bytes == nullptr) return kInvalidValue;
    size_t total = static_cast<size_t>(d.cfg.total_memory);
    size_t used = d.devices[dev].allocated + static_cast<size_t>(d.cfg.other_allocator_bytes);
    *total_bytes = total;
    *free_bytes = used >= total ? 0 : total - used;
    return kSuccess;
  });
}

// The device allocation a copy on `s` reads or writes, or nullptr after reporting why not.
Allocation* device_range(Driver& d, const Stream* s, uintptr_t p, size_t n, const char* fn,
                         const char* role) {
  Allocation* a = find_allocation(d, p);
  if (a == nullptr || a->pinned) {
    misuse("%s: %s 0x%llx is not device memory from cuMemAlloc", fn, role,
           static_cast<unsigned long long>(p));
    return nullptr;
  }
  if (!a->live) {
    misuse("handle used after destroy: %s with %s 0x%llx in device memory freed by cuMemFree", fn,
           role, static_cast<unsigned long long>(p));
    return nullptr;
  }
  if (s != nullptr && a->device != s->device) {
    misuse("%s: %s 0x%llx is memory of device %d but %s belongs to device %d", fn, role,
           static_cast<unsigned long long>(p), a->device, describe_stream(s).c_str(), s->device);
    return nullptr;
  }
  if (!range_inside(*a, p, n)) {
    misuse("%s: copy range past the end of an allocation (%s 0x%llx + %zu bytes, allocation of %zu "
           "bytes at 0x%llx)",
           fn, role, static_cast<unsigned long long>(p), n, a->size,
           static_cast<unsigned long long>(a->base));
    return nullptr;
  }
  return a;
}

CUresult fake_cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes, CUstream hs) {
  return api("cuMemcpyHtoDAsync", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    const char* fn = "cuMemcpyHtoDAsync";
    CUresult err = kSuccess;
    Stream* s = resolve_stream(d, hs, fn, &err);
    if (s == nullptr) return err;
    if (bytes == 0) return kSuccess;
    auto src_addr = reinterpret_cast<uintptr_t>(src);
    Allocation* pin = find_allocation(d, src_addr);
    if (pin != nullptr && pin->pinned && !pin->live) {
      misuse("handle used after destroy: %s from %p in pinned memory freed by cuMemFreeHost", fn, src);
      return kInvalidValue;
    }
    if (pin == nullptr || !pin->pinned || !range_inside(*pin, src_addr, bytes)) {
      misuse("source not page-locked: %s of %zu bytes from %p, which is not entirely inside one "
             "cuMemHostAlloc block or cuMemHostRegister range",
             fn, bytes, src);
      return kInvalidValue;
    }
    if (!(pin->flags & kHostAllocPortable) && pin->device != s->device) {
      misuse("source not page-locked: %s on %s from %p, allocated by cuMemHostAlloc in device %d's "
             "context without CU_MEMHOSTALLOC_PORTABLE",
             fn, describe_stream(s).c_str(), src, pin->device);
      return kInvalidValue;
    }
    Allocation* dev = device_range(d, s, static_cast<uintptr_t>(dst), bytes, fn, "destination");
    if (dev == nullptr) return kInvalidValue;
    // A copy refused in a way that leaves the context usable (the launch errors a real driver
    // returns here come from an earlier kernel's fault and are sticky: see fake_cuda_fault).
    if (inject_failure(d.cfg.fail_copy_after)) return kUnknown;
    if (captured(s)) return kSuccess;
    if (!(s->flags & kStreamNonBlocking))
      misuse("copy on a blocking stream: %s on %s, created without CU_STREAM_NON_BLOCKING", fn,
             describe_stream(s).c_str());
    implicit_sync(d, s);
    Access me = advance(d, s);
    size_t offset = static_cast<size_t>(dst) - dev->base;
    if (auto c = shadow_write(dev->shadow, offset, offset + bytes, me, s->clock))
      misuse("device buffer overwritten before the release event of its previous use completed: %s "
             "of %zu bytes to 0x%llx on %s, but the %s at offset %zu by %s was not waited for",
             fn, bytes, dst, describe_stream(s).c_str(), c->with_write ? "write" : "read", c->offset,
             describe_timeline(c->with.timeline).c_str());
    note_access(dev->users, me);
    note_access(pin->users, me);
    Op op;
    op.kind = OpKind::kHtoD;
    op.seq = me.tick;
    op.dst = reinterpret_cast<void*>(static_cast<uintptr_t>(dst));
    op.src = src;
    op.bytes = bytes;
    op.host = pin;
    op.device = dev;
    op.source_sum = checksum(src, bytes);
    push_op(s, op);
    return kSuccess;
  });
}

// Shared by cuMemcpyDtoHAsync and cuMemcpyDtoH; `s` is null for the synchronous form, which runs
// on the default stream of the source's device.
CUresult copy_to_host(Driver& d, Lock& lk, Stream* s, void* dst, CUdeviceptr src, size_t bytes,
                      bool synchronous, const char* fn) {
  Allocation* dev = device_range(d, s, static_cast<uintptr_t>(src), bytes, fn, "source");
  if (dev == nullptr) return kInvalidValue;
  if (s == nullptr) {
    Device& device = d.devices[dev->device];
    if (device.default_stream == nullptr) device.default_stream = new_stream(d, dev->device, 0, true);
    s = device.default_stream;
  }
  auto dst_addr = reinterpret_cast<uintptr_t>(dst);
  Allocation* pin = find_allocation(d, dst_addr);
  if (pin != nullptr && !pin->pinned) {
    misuse("%s: destination %p is device memory", fn, dst);
    return kInvalidValue;
  }
  if (pin != nullptr && !pin->live) {
    misuse("handle used after destroy: %s into %p in pinned memory freed by cuMemFreeHost", fn, dst);
    return kInvalidValue;
  }
  if (pin != nullptr && !range_inside(*pin, dst_addr, bytes)) {
    misuse("%s: copy range past the end of an allocation (destination %p + %zu bytes)", fn, dst, bytes);
    return kInvalidValue;
  }
  if (captured(s)) return kSuccess;
  implicit_sync(d, s);
  Access me = advance(d, s);
  Clock clock = s->clock;
  size_t offset = static_cast<size_t>(src) - dev->base;
  if (auto c = shadow_read(dev->shadow, offset, offset + bytes, me, clock))
    misuse("device memory read before the consumer stream waited for its copy: %s of %zu bytes "
           "from 0x%llx on %s, but the copy that wrote offset %zu on %s was not waited for",
           fn, bytes, src, describe_stream(s).c_str(), c->offset,
           describe_timeline(c->with.timeline).c_str());
  note_access(dev->users, me);
  if (pin) note_access(pin->users, me);
  Op op;
  op.kind = OpKind::kDtoH;
  op.seq = me.tick;
  op.dst = dst;
  op.src = reinterpret_cast<const void*>(static_cast<uintptr_t>(src));
  op.bytes = bytes;
  op.host = pin;
  op.device = dev;
  push_op(s, op);
  // Pageable destinations are written before the call returns, as CUDA does.
  if (synchronous || pin == nullptr) {
    if (!wait_for_ops(d, lk, s, me.tick)) return kDeinitialized;
    join(d.host, clock);
  }
  return kSuccess;
}

CUresult fake_cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes, CUstream hs) {
  return api("cuMemcpyDtoHAsync", true, [&](Lock& lk) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    Stream* s = resolve_stream(d, hs, "cuMemcpyDtoHAsync", &err);
    if (s == nullptr) return err;
    if (bytes == 0) return kSuccess;
    return copy_to_host(d, lk, s, dst, src, bytes, false, "cuMemcpyDtoHAsync");
  });
}

CUresult fake_cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t bytes) {
  return api("cuMemcpyDtoH", true, [&](Lock& lk) -> CUresult {
    if (bytes == 0) return kSuccess;
    return copy_to_host(drv(), lk, nullptr, dst, src, bytes, true, "cuMemcpyDtoH");
  });
}

// ---- Stream capture (the part a loader meets: who may call what while a user captures a graph).

CUresult fake_cuThreadExchangeStreamCaptureMode(int* mode) {
  return api("cuThreadExchangeStreamCaptureMode", true, [&](Lock&) -> CUresult {
    if (mode == nullptr || *mode < kCaptureGlobal || *mode > kCaptureRelaxed) return kInvalidValue;
    std::swap(*mode, t_capture_mode);
    return kSuccess;
  });
}

CUresult fake_cuStreamBeginCapture(CUstream hs, int mode) {
  return api("cuStreamBeginCapture", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    if (reinterpret_cast<uintptr_t>(hs) == 0 || reinterpret_cast<uintptr_t>(hs) == kStreamLegacy)
      return kCaptureUnsupported;  // the legacy stream cannot be captured
    Stream* s = resolve_stream(d, hs, "cuStreamBeginCapture", &err);
    if (s == nullptr) return err;
    if (mode < kCaptureGlobal || mode > kCaptureRelaxed) return kInvalidValue;
    if (captured(s)) return kIllegalState;
    s->capture_mode = mode;
    s->capture_invalidated = false;
    s->capturer = std::this_thread::get_id();
    d.capturing.push_back(s);
    return kSuccess;
  });
}

// *graph gets a placeholder handle (the stand-in builds no graph), or null when the capture was
// invalidated (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
CUresult fake_cuStreamEndCapture(CUstream hs, void** graph) {
  return api("cuStreamEndCapture", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    Stream* s = resolve_stream(d, hs, "cuStreamEndCapture", &err);
    if (s == nullptr) return err;
    if (graph == nullptr) return kInvalidValue;
    if (!captured(s)) return kIllegalState;
    if (s->capturer != std::this_thread::get_id() && s->capture_mode != kCaptureRelaxed) return kCaptureWrongThread;
    d.capturing.erase(std::find(d.capturing.begin(), d.capturing.end(), s));
    s->capture_mode = -1;
    static int placeholder;
    *graph = s->capture_invalidated ? nullptr : &placeholder;
    return s->capture_invalidated ? kCaptureInvalidated : kSuccess;
  });
}

// *status: 0 none, 1 active, 2 invalidated (CUstreamCaptureStatus).
CUresult fake_cuStreamIsCapturing(CUstream hs, int* status) {
  return api("cuStreamIsCapturing", true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    Stream* s = resolve_stream(d, hs, "cuStreamIsCapturing", &err);
    if (s == nullptr) return err;
    if (status == nullptr) return kInvalidValue;
    *status = !captured(s) ? 0 : s->capture_invalidated ? 2 : 1;
    return kSuccess;
  });
}

// ---- Entry point lookup, by name and CUDA version.

CUresult get_proc_address(const char* symbol, void** pfn, int version, int* status);

CUresult fake_cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                  unsigned long long /*flags*/, int* status) {
  return get_proc_address(symbol, pfn, cudaVersion, status);
}

CUresult fake_cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                               unsigned long long /*flags*/) {
  return get_proc_address(symbol, pfn, cudaVersion, nullptr);
}

// `since`: the CUDA version whose ABI the stand-in's implementation has (the one cuda.h's _v2,
// _v3 ... #defines select from that version on). As in CUDA, asking for an older version finds
// nothing (there is no older variant here), and a driver older than `since` lacks the symbol.
struct Entry {
  const char* name;
  void* fn;
  int since;
};

#define FAKE_ENTRY(name, since) {#name, reinterpret_cast<void*>(&fake_##name), since}

const Entry kEntries[] = {
    FAKE_ENTRY(cuGetErrorString, 6000),
    FAKE_ENTRY(cuGetErrorName, 6000),
    FAKE_ENTRY(cuInit, 2000),
    FAKE_ENTRY(cuDriverGetVersion, 2020),
    FAKE_ENTRY(cuDeviceGetCount, 2000),
    FAKE_ENTRY(cuDeviceGet, 2000),
    FAKE_ENTRY(cuDeviceGetName, 2000),
    FAKE_ENTRY(cuDevicePrimaryCtxRetain, 7000),
    FAKE_ENTRY(cuDevicePrimaryCtxRelease, 11000),
    FAKE_ENTRY(cuCtxSetCurrent, 4000),
    FAKE_ENTRY(cuCtxGetCurrent, 4000),
    FAKE_ENTRY(cuCtxSynchronize, 2000),
    FAKE_ENTRY(cuStreamCreate, 2000),
    FAKE_ENTRY(cuStreamDestroy, 4000),
    FAKE_ENTRY(cuStreamWaitEvent, 3020),
    FAKE_ENTRY(cuStreamSynchronize, 2000),
    FAKE_ENTRY(cuStreamQuery, 2000),
    FAKE_ENTRY(cuEventCreate, 2000),
    FAKE_ENTRY(cuEventRecord, 2000),
    FAKE_ENTRY(cuEventQuery, 2000),
    FAKE_ENTRY(cuEventSynchronize, 2000),
    FAKE_ENTRY(cuEventElapsedTime, 2000),
    FAKE_ENTRY(cuEventDestroy, 4000),
    FAKE_ENTRY(cuMemAlloc, 3020),
    FAKE_ENTRY(cuMemFree, 3020),
    FAKE_ENTRY(cuMemHostAlloc, 2020),
    FAKE_ENTRY(cuMemFreeHost, 2000),
    FAKE_ENTRY(cuMemHostRegister, 6050),
    FAKE_ENTRY(cuMemHostUnregister, 4000),
    FAKE_ENTRY(cuMemcpyHtoDAsync, 3020),
    FAKE_ENTRY(cuMemcpyDtoHAsync, 3020),
    FAKE_ENTRY(cuMemcpyDtoH, 3020),
    FAKE_ENTRY(cuMemGetInfo, 3020),
    FAKE_ENTRY(cuThreadExchangeStreamCaptureMode, 10010),
    FAKE_ENTRY(cuStreamBeginCapture, 10010),
    FAKE_ENTRY(cuStreamEndCapture, 10000),
    FAKE_ENTRY(cuStreamIsCapturing, 10000),
    {"cuGetProcAddress", reinterpret_cast<void*>(&fake_cuGetProcAddress_v2), 12000},
};

#undef FAKE_ENTRY

constexpr int kProcFound = 0;                // CU_GET_PROC_ADDRESS_SUCCESS
constexpr int kProcNotFound = 1;             // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
constexpr int kProcVersionNotSufficient = 2; // CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT

CUresult get_proc_address(const char* symbol, void** pfn, int version, int* status) {
  if (symbol == nullptr || pfn == nullptr) return kInvalidValue;
  long long driver_version;
  {
    Driver& d = drv();
    Lock lk(d.mu);
    driver_version = d.cfg.driver_version;
  }
  *pfn = nullptr;
  for (const Entry& e : kEntries) {
    if (std::strcmp(e.name, symbol) != 0) continue;
    if (e.since > driver_version) break;  // this driver predates the symbol
    if (version < e.since) {
      if (status) *status = kProcVersionNotSufficient;
      return kNotFound;
    }
    *pfn = e.fn;
    if (status) *status = kProcFound;
    return kSuccess;
  }
  if (status) *status = kProcNotFound;
  return kNotFound;
}

// ---- Load and unload.

void after_fork_in_child() {
  // The parent's worker threads do not exist here and its locks may be held forever; a child of a
  // process that used the driver gets errors, as with the real one.
  if (g_used.load()) g_forked.store(true);
}

void read_environment(Config& cfg) {
  for (const ConfigKey& k : kConfigKeys) {
    std::string var = "FAKE_CUDA_";
    for (const char* c = k.name; *c; ++c) var += static_cast<char>(std::toupper(static_cast<unsigned char>(*c)));
    const char* text = std::getenv(var.c_str());
    if (text == nullptr || *text == '\0') continue;
    char* end = nullptr;
    long long v = std::strtoll(text, &end, 0);
    if (*end != '\0' || v < k.min || v > k.max) {
      std::fprintf(stderr, "fake_libcuda: ignoring %s=%s (not an integer in [%lld, %lld])\n",
                   var.c_str(), text, k.min, k.max);
      continue;
    }
    cfg.*(k.field) = v;
  }
}

// Stops every worker so a process (or dlclose) never ends with one of our threads running code
// that is about to be unmapped. Later calls return CUDA_ERROR_DEINITIALIZED, as the real driver
// does during exit.
void shut_down() {
  if (g_forked.load()) return;
  Driver& d = drv();
  std::vector<std::thread> workers;
  {
    Lock lk(d.mu);
    d.shutdown = true;
    for (Stream* s : d.streams) {
      s->stop = true;
      s->wake.notify_all();
      if (s->worker.joinable()) workers.push_back(std::move(s->worker));
    }
    d.progress.notify_all();
  }
  for (std::thread& t : workers) t.join();
}

struct Lifetime {
  Lifetime() {
    read_environment(drv().cfg);
    pthread_atfork(nullptr, nullptr, after_fork_in_child);
  }
  ~Lifetime() { shut_down(); }
  Lifetime(const Lifetime&) = delete;
  Lifetime& operator=(const Lifetime&) = delete;
};

Lifetime g_lifetime;

}  // namespace

// ---- Exported: the two getters and the test controls.

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                         unsigned long long flags, int* symbolStatus) {
  return fake_cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
}

FAKE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                      unsigned long long flags) {
  return fake_cuGetProcAddress(symbol, pfn, cudaVersion, flags);
}

FAKE_EXPORT int fake_cuda_misuse_count(void) {
  Driver& d = drv();
  std::lock_guard<std::mutex> g(d.log.mu);
  return static_cast<int>(std::min<long long>(d.log.count, INT32_MAX));
}

// Copies message i (0-based, NUL-terminated, truncated to len - 1 bytes) and returns its full
// length, or -1 if there is no message i. Messages past the first 10000 are counted, not kept.
FAKE_EXPORT int fake_cuda_misuse_message(int i, char* buf, int len) {
  Driver& d = drv();
  std::lock_guard<std::mutex> g(d.log.mu);
  if (i < 0 || static_cast<size_t>(i) >= d.log.messages.size()) return -1;
  const std::string& m = d.log.messages[static_cast<size_t>(i)];
  if (buf != nullptr && len > 0) {
    size_t n = std::min(m.size(), static_cast<size_t>(len) - 1);
    std::memcpy(buf, m.data(), n);
    buf[n] = '\0';
  }
  return static_cast<int>(m.size());
}

FAKE_EXPORT void fake_cuda_reset_misuses(void) {
  Driver& d = drv();
  std::lock_guard<std::mutex> g(d.log.mu);
  d.log.count = 0;
  d.log.messages.clear();
}

// 0 if set; -1 for an unknown key or a value out of range (the value is then left unchanged).
FAKE_EXPORT int fake_cuda_configure(const char* key, long long value) {
  if (g_forked.load()) return -1;  // the parent's lock may be held forever in a fork child
  const ConfigKey* k = find_key(key);
  if (k == nullptr || value < k->min || value > k->max) return -1;
  Driver& d = drv();
  Lock lk(d.mu);
  d.cfg.*(k->field) = value;
  if (k->field == &Config::paused && value == 0)
    for (Stream* s : d.streams) s->wake.notify_all();
  return 0;
}

// Current value of a counter, or -1 for an unknown key.
FAKE_EXPORT long long fake_cuda_stat(const char* key) {
  if (key == nullptr || g_forked.load()) return -1;
  Driver& d = drv();
  Lock lk(d.mu);
  std::string k = key;
  if (k == "device_bytes") return d.device_bytes;
  if (k == "device_allocations") return d.device_allocations;
  if (k == "pinned_bytes") return d.pinned_bytes;
  if (k == "pinned_allocations") return d.pinned_allocations;
  if (k == "live_streams") return d.live_streams;
  if (k == "live_events") return d.live_events;
  if (k == "copies") return d.copies;
  if (k == "registered_bytes") return d.registered_bytes;
  if (k == "capturing") return static_cast<long long>(d.capturing.size());
  if (k == "pending_ops") {
    long long n = 0;
    for (const Stream* s : d.streams) n += static_cast<long long>(s->queue.size());
    return n;
  }
  if (k == "contexts_retained") {
    long long n = 0;
    for (const Device& dev : d.devices) n += dev.refcount;
    return n;
  }
  const ConfigKey* c = find_key(key);
  if (c != nullptr) return d.cfg.*(c->field);
  return -1;
}

namespace {

// Calls of entry point `name` in `counts`; "implicit_syncs" sums the implicit synchronisation
// points (is_implicit_sync), which a loader's steady state should not make.
// `counts` indexed as Driver::calls; called with Driver::mu held.
long long calls_in(const long long* counts, const char* name) {
  Driver& d = drv();
  const bool syncs = std::strcmp(name, "implicit_syncs") == 0;
  long long n = 0;
  for (size_t i = 0; i < d.call_names.size(); ++i)
    if (syncs ? is_implicit_sync(d.call_names[i]) : std::strcmp(d.call_names[i], name) == 0) n += counts[i];
  return n;
}

// Enqueues a control op on a stream named as a driver call would name it (0x1, 0x2 included).
int enqueue_control(void* stream, const char* fn, Op op) {
  return api(fn, true, [&](Lock&) -> CUresult {
    Driver& d = drv();
    CUresult err = kSuccess;
    Stream* s = resolve_stream(d, static_cast<CUstream>(stream), fn, &err);
    if (s == nullptr) return err;
    if (captured(s)) return kSuccess;
    implicit_sync(d, s);
    op.seq = advance(d, s).tick;
    push_op(s, op);
    return kSuccess;
  });
}

}  // namespace

// Calls made so far of a driver entry point (by name, e.g. "cuMemAlloc"), or of all the implicit
// synchronisation points ("implicit_syncs": allocations, frees, page-locking, context and stream
// synchronisation, synchronous copies): by the whole process, or by the calling thread only.
FAKE_EXPORT long long fake_cuda_calls(const char* name) {
  if (name == nullptr || g_forked.load()) return -1;
  Driver& d = drv();
  Lock lk(d.mu);
  return calls_in(d.calls.data(), name);
}

FAKE_EXPORT long long fake_cuda_thread_calls(const char* name) {
  if (name == nullptr || g_forked.load()) return -1;
  Driver& d = drv();
  Lock lk(d.mu);
  return calls_in(t_calls, name);
}

// Keeps `stream` busy for `us` microseconds once its earlier work has run, as a kernel of a
// training step would (torch.cuda._sleep). Returns a CUresult.
FAKE_EXPORT int fake_cuda_stream_sleep(void* stream, long long us) {
  if (us < 0) return kInvalidValue;
  Op op;
  op.kind = OpKind::kSleep;
  op.sleep_us = us;
  return enqueue_control(stream, "fake_cuda_stream_sleep", op);
}

// A kernel on `stream` that faults with `code` (CUDA_ERROR_ILLEGAL_ADDRESS, say) when it runs:
// from then on every call in that device's context fails with `code`. Returns a CUresult.
FAKE_EXPORT int fake_cuda_fault(void* stream, int code) {
  if (code == kSuccess) return kInvalidValue;
  Op op;
  op.kind = OpKind::kFault;
  op.fault = code;
  return enqueue_control(stream, "fake_cuda_fault", op);
}

// Tests only: forgets a device's sticky error (CUDA needs a new process or cuDevicePrimaryCtxReset).
FAKE_EXPORT int fake_cuda_clear_fault(int device) {
  if (device < 0 || device >= kMaxDevices || g_forked.load()) return -1;
  Driver& d = drv();
  Lock lk(d.mu);
  d.devices[device].sticky = kSuccess;
  return 0;
}

// 1 if `p` lies in live page-locked memory (cuMemHostAlloc or cuMemHostRegister), else 0.
FAKE_EXPORT int fake_cuda_page_locked(const void* p) {
  if (g_forked.load()) return -1;
  Driver& d = drv();
  Lock lk(d.mu);
  const Allocation* a = find_allocation(d, reinterpret_cast<uintptr_t>(p));
  return a != nullptr && a->pinned && a->live && range_inside(*a, reinterpret_cast<uintptr_t>(p), 1) ? 1 : 0;
}
