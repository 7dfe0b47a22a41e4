// ZeroMQ's ordering, told to ThreadSanitizer. Built only under MQLM_SANITIZE=thread and linked,
// with -Wl,--wrap=zmq_msg_send,... (cmake/sanitizers.cmake), into every target that links cppzmq.
//
// Why: libzmq is not instrumented and hands a message from one thread to another through its own
// lock-free queues, which TSan cannot see (tsan.supp also tells TSan to ignore what libzmq does
// itself). A frame one actor writes and another actor in the same process reads (inproc passes the
// very bytes) would then look like a data race. The happens-before ZeroMQ gives is modelled on the
// address of the message's bytes:
// - zmq_msg_send releases on them before the send, zmq_msg_recv acquires on them after a receive:
//   everything the sender did before sending happens before what the receiver does after;
// - zmq_msg_close releases on them before the reference is dropped, and the free function of a
//   message on the caller's own bytes (zmq_msg_init_data) acquires on them before it runs: freeing
//   them comes after the reads of every thread that held a reference (cache_writer shares frames).
// Messages copied into libzmq (zmq_send, short messages) need nothing: the copies are libzmq's own.
#include <sanitizer/tsan_interface.h>
#include <zmq.h>

#include <map>
#include <memory>
#include <string>

extern "C" {
int __real_zmq_msg_send(zmq_msg_t* msg, void* socket, int flags);
int __real_zmq_msg_recv(zmq_msg_t* msg, void* socket, int flags);
int __real_zmq_msg_close(zmq_msg_t* msg);
int __real_zmq_msg_init_data(zmq_msg_t* msg, void* data, size_t size, zmq_free_fn* free_fn, void* hint);
const char* __real_zmq_msg_gets(const zmq_msg_t* msg, const char* property);
int __wrap_zmq_msg_send(zmq_msg_t* msg, void* socket, int flags);
int __wrap_zmq_msg_recv(zmq_msg_t* msg, void* socket, int flags);
int __wrap_zmq_msg_close(zmq_msg_t* msg);
int __wrap_zmq_msg_init_data(zmq_msg_t* msg, void* data, size_t size, zmq_free_fn* free_fn, void* hint);
const char* __wrap_zmq_msg_gets(const zmq_msg_t* msg, const char* property);
// TSan's dynamic annotations (libtsan exports them; no header declares them).
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
}

namespace {

void release_bytes(zmq_msg_t* msg) {
  if (zmq_msg_size(msg) > 0) __tsan_release(zmq_msg_data(msg));
}

// The caller's free function and its hint, called after acquiring on the bytes.
struct FreeCall {
  zmq_free_fn* free_fn;
  void* hint;
};

void free_after_acquire(void* data, void* hint) {
  __tsan_acquire(data);
  std::unique_ptr<FreeCall> call(static_cast<FreeCall*>(hint));
  call->free_fn(data, call->hint);
}

}  // namespace

int __wrap_zmq_msg_send(zmq_msg_t* msg, void* socket, int flags) {
  release_bytes(msg);
  return __real_zmq_msg_send(msg, socket, flags);
}

int __wrap_zmq_msg_recv(zmq_msg_t* msg, void* socket, int flags) {
  int rc = __real_zmq_msg_recv(msg, socket, flags);
  if (rc > 0) __tsan_acquire(zmq_msg_data(msg));
  return rc;
}

int __wrap_zmq_msg_close(zmq_msg_t* msg) {
  release_bytes(msg);
  return __real_zmq_msg_close(msg);
}

int __wrap_zmq_msg_init_data(zmq_msg_t* msg, void* data, size_t size, zmq_free_fn* free_fn, void* hint) {
  if (free_fn == nullptr) return __real_zmq_msg_init_data(msg, data, size, free_fn, hint);
  auto call = std::make_unique<FreeCall>(FreeCall{free_fn, hint});
  int rc = __real_zmq_msg_init_data(msg, data, size, free_after_acquire, call.get());
  if (rc == 0) call.release();  // free_after_acquire owns it now
  return rc;
}

// zmq_msg_gets hands out a property of a received message (the User-Id a ZAP handler gave a CURVE
// client) that libzmq's I/O thread wrote into the message's metadata, out of TSan's sight, and
// nothing of libzmq's releases it. The value is copied here with TSan not watching the reads, and the copy,
// this thread's own, is what the caller reads: valid until this thread asks for the same property
// again, where libzmq's is valid while the message lives (every caller copies it at once).
const char* __wrap_zmq_msg_gets(const zmq_msg_t* msg, const char* property) {
  const char* value = __real_zmq_msg_gets(msg, property);
  if (value == nullptr) return nullptr;
  thread_local std::map<std::string, std::string> copies;
  std::string copy;
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  copy.assign(value);
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  auto& kept = copies[property];
  kept = std::move(copy);
  return kept.c_str();
}
