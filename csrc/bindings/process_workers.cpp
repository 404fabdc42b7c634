// Worker processes, the main process's side; see process_workers.h.
#include "bindings/process_workers.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <chrono>
#include <thread>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fastload {

namespace {

template <typename T>
void put(std::string& buf, T value) {
  buf.append(reinterpret_cast<const char*>(&value), sizeof value);
}

template <typename T>
T get(const std::string& buf, size_t* at) {
  T value;
  if (*at + sizeof value > buf.size()) throw std::runtime_error("a worker's reply is truncated");
  std::memcpy(&value, buf.data() + *at, sizeof value);
  *at += sizeof value;
  return value;
}

// A signal's abbreviation ("KILL"), or nullptr for one not listed: sigabbrev_np says the same
// but needs glibc 2.32, newer than the glibc 2.28 the manylinux wheel is built against.
const char* signal_abbreviation(int sig) {
  switch (sig) {
    case SIGHUP: return "HUP";
    case SIGINT: return "INT";
    case SIGQUIT: return "QUIT";
    case SIGILL: return "ILL";
    case SIGTRAP: return "TRAP";
    case SIGABRT: return "ABRT";
    case SIGBUS: return "BUS";
    case SIGFPE: return "FPE";
    case SIGKILL: return "KILL";
    case SIGUSR1: return "USR1";
    case SIGSEGV: return "SEGV";
    case SIGUSR2: return "USR2";
    case SIGPIPE: return "PIPE";
    case SIGALRM: return "ALRM";
    case SIGTERM: return "TERM";
    case SIGXCPU: return "XCPU";
    case SIGXFSZ: return "XFSZ";
    case SIGSYS: return "SYS";
    default: return nullptr;
  }
}

// How a process that is gone ended, from /proc/<pid>/stat while it is a zombie (field 52 is its
// wait status); "" when that cannot be read.
std::string exit_description(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return "";
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  std::vector<std::string> fields;
  while (rest >> field) fields.push_back(field);
  if (fields.empty() || fields[0] != "Z" || fields.size() < 50) return "";
  const int status = std::stoi(fields.back());
  if ((status & 0x7f) != 0) {
    const int sig = status & 0x7f;
    const char* name = signal_abbreviation(sig);
    return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "exited with status " + std::to_string((status >> 8) & 0xff);
}

void send_all(int fd, const std::string& buf, const std::vector<int>& fds) {
  size_t sent = 0;
  bool first = true;
  while (sent < buf.size()) {
    struct iovec iov;
    iov.iov_base = const_cast<char*>(buf.data() + sent);
    iov.iov_len = buf.size() - sent;
    struct msghdr msg;
    std::memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    std::vector<char> control;
    if (first && !fds.empty()) {  // the descriptors ride on the first byte of the message
      control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "sendmsg");
    }
    sent += static_cast<size_t>(n);
    first = false;
  }
}

// Reads exactly n bytes; false on end of file (the worker is gone).
bool read_exact(int fd, char* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    struct pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, 100);
    if (ready < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
    if (ready <= 0) continue;
    const ssize_t r = recv(fd, out + got, n - got, 0);
    if (r == 0) return false;
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET) return false;
      throw std::system_error(errno, std::generic_category(), "recv");
    }
    got += static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

WorkerPool::WorkerPool(std::vector<int> fds, std::vector<int64_t> pids, std::shared_ptr<SharedMemoryAllocator> memory)
    : memory_(std::move(memory)) {
  if (fds.size() != pids.size()) throw std::invalid_argument("one pid per worker socket is needed");
  for (size_t k = 0; k < fds.size(); ++k) workers_.push_back({fds[k], pids[k], {}});
}

void WorkerPool::died(const Worker& w, size_t index, const FillRequest& r, const std::string& how) const {
  // The socket closes while the process is still exiting: give it a moment to become a zombie,
  // whose status says how it ended.
  std::string ended = exit_description(w.pid);
  for (int i = 0; i < 50 && ended.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ended = exit_description(w.pid);
  }
  if (ended.empty()) ended = "exited";
  throw std::runtime_error("fastload worker process " + std::to_string(index) + " (pid " + std::to_string(w.pid) +
                           ") " + ended + " while building the batch of dataset[" +
                           std::to_string(r.count ? r.ids[0] : 0) + "] and " + std::to_string(r.count - 1) +
                           " more samples" + (how.empty() ? "" : " (" + how + ")") +
                           "; a crash in native code, os._exit() or the kernel's OOM killer end a worker like this");
}

std::string WorkerPool::run(const FillRequest& r, size_t num_parts) {
  const size_t k = static_cast<size_t>(r.thread);
  if (k >= workers_.size()) throw std::logic_error("no worker process for collation thread " + std::to_string(k));
  Worker& w = workers_[k];
  std::vector<uint64_t> freed;
  memory_->freed_since(&w.freed_cursor, &freed);
  std::vector<uint64_t> forget;
  for (uint64_t id : freed)
    if (w.sent.erase(id)) forget.push_back(id);
  std::vector<SharedSegment> parts(num_parts);
  std::vector<SharedSegment> fresh;
  for (size_t p = 0; p < num_parts; ++p) {
    if (!memory_->locate(r.parts[p], &parts[p]))
      throw std::logic_error("a batch part is not in shared memory: the engine must allocate from the workers' pool");
    if (w.sent.insert(parts[p].id).second) fresh.push_back(parts[p]);
  }
  std::string msg;
  put<uint64_t>(msg, 0);  // length, filled in below
  put<uint32_t>(msg, 1);
  put<uint32_t>(msg, static_cast<uint32_t>(num_parts));
  put<uint64_t>(msg, r.seed);
  put<int64_t>(msg, r.epoch);
  put<int64_t>(msg, r.step);
  put<int64_t>(msg, r.count);
  put<uint32_t>(msg, static_cast<uint32_t>(fresh.size()));
  put<uint32_t>(msg, static_cast<uint32_t>(forget.size()));
  msg.append(reinterpret_cast<const char*>(r.ids), sizeof(int64_t) * static_cast<size_t>(r.count));
  for (const SharedSegment& s : parts) {
    put<uint64_t>(msg, s.id);
    put<uint64_t>(msg, s.offset);
  }
  std::vector<int> fds;
  for (const SharedSegment& s : fresh) {
    put<uint64_t>(msg, s.id);
    put<uint64_t>(msg, s.size);
    fds.push_back(s.fd);
  }
  for (uint64_t id : forget) put<uint64_t>(msg, id);
  const uint64_t length = msg.size();
  std::memcpy(msg.data(), &length, sizeof length);
  try {
    send_all(w.fd, msg, fds);
  } catch (const std::system_error& e) {
    died(w, k, r, e.what());
  }
  uint64_t reply_length = 0;
  if (!read_exact(w.fd, reinterpret_cast<char*>(&reply_length), sizeof reply_length)) died(w, k, r, "");
  if (reply_length < 16 || reply_length > (uint64_t{1} << 40)) died(w, k, r, "a malformed reply");
  std::string reply(reply_length - sizeof reply_length, '\0');
  if (!read_exact(w.fd, reply.data(), reply.size())) died(w, k, r, "");
  size_t at = 0;
  const uint32_t status = get<uint32_t>(reply, &at);
  const uint32_t message_bytes = get<uint32_t>(reply, &at);
  if (at + message_bytes > reply.size()) died(w, k, r, "a malformed reply");
  std::string message = reply.substr(at, message_bytes);
  std::string payload = reply.substr(at + message_bytes);
  if (status != 0) throw WorkerError(message + " (in worker process " + std::to_string(k) + ")", std::move(payload));
  return payload;
}

}  // namespace fastload
