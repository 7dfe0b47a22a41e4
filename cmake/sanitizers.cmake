# MQLM_SANITIZE: every mqlm target (libraries, the binary, the tests) built and linked under
# sanitizers, "address,undefined" (ASan + UBSan, LeakSanitizer included) or "thread" (TSan).
# Only what this project compiles: the fuzzers' clang++ project (tests/fuzz) is configured apart
# and keeps its own -fsanitize flags. tests/sanitizers/run.sh configures, builds and runs these.
set(MQLM_SANITIZE "" CACHE STRING "Sanitizers for every mqlm target: empty, address,undefined or thread")
set_property(CACHE MQLM_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")
if(MQLM_SANITIZE STREQUAL "")
  return()
endif()
if(NOT MQLM_SANITIZE MATCHES "^(address,undefined|thread)$")
  message(FATAL_ERROR "MQLM_SANITIZE is \"${MQLM_SANITIZE}\": give address,undefined or thread")
endif()
message(STATUS "sanitizers: ${MQLM_SANITIZE}")

# Frame pointers keep the reports' stacks whole; an undefined-behaviour report ends the process,
# so a test cannot pass past one. -O1 -g1 after the build type's -O2 -g: the reports keep their
# file:line stacks, and compiling takes about 40% less CPU (actors/http/bridge.cpp under ASan:
# 15.0 s user against 24.5 s).
add_compile_options(-fsanitize=${MQLM_SANITIZE} -fno-omit-frame-pointer -O1 -g1)
add_link_options(-fsanitize=${MQLM_SANITIZE})
if(MQLM_SANITIZE MATCHES "undefined")
  add_compile_options(-fno-sanitize-recover=undefined)
endif()
# GCC 12's warnings that the instrumentation itself brings, which -Werror would turn into errors:
# ASan's inlined checks make -Wmaybe-uninitialized guess wrong, and TSan warns (-Wtsan) at every
# std::atomic_thread_fence, which it does not model (ZeroMQ, spdlog and std headers have them).
add_compile_options(-Wno-maybe-uninitialized)
if(MQLM_SANITIZE STREQUAL "thread")
  add_compile_options(-Wno-tsan)
endif()

# The sanitizers' runtime options for every test ctest runs (and every process a test starts):
# reports go to files under BUILD/sanitizer-logs, which tests/sanitizers/run.sh reads after the
# suite, since a report in a server process that a test kills would otherwise go unseen.
set(logs ${CMAKE_BINARY_DIR}/sanitizer-logs)
set(supp ${PROJECT_SOURCE_DIR}/tests/sanitizers)
file(WRITE ${CMAKE_BINARY_DIR}/sanitizer-options.cmake
  "# Written by cmake/sanitizers.cmake: the sanitizers' options, read by ctest before any test.\n"
  "file(MAKE_DIRECTORY \"${logs}\")\n"
  "set(ENV{ASAN_OPTIONS} \"log_path=${logs}/asan:detect_leaks=1:strict_init_order=1:check_initialization_order=1\")\n"
  "set(ENV{LSAN_OPTIONS} \"suppressions=${supp}/lsan.supp:print_suppressions=0\")\n"
  "set(ENV{UBSAN_OPTIONS} \"log_path=${logs}/ubsan:print_stacktrace=1:halt_on_error=1:suppressions=${supp}/ubsan.supp\")\n"
  "set(ENV{TSAN_OPTIONS} \"log_path=${logs}/tsan:second_deadlock_stack=1:suppressions=${supp}/tsan.supp\")\n")
set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY TEST_INCLUDE_FILES
             ${CMAKE_BINARY_DIR}/sanitizer-options.cmake)

# ASan: shared libraries stay loaded to the end (tests/sanitizers/keep_libraries_loaded.cpp says
# why), in every executable, whose own dlclose comes before the C library's and ASan's.
if(MQLM_SANITIZE MATCHES "address")
  # An object, not an archive: libasan.so defines dlclose too (its interceptor), and comes first on
  # the link line, so an archive's member would never be pulled in (nm showed dlclose undefined).
  add_library(mqlm_keep_libraries_loaded OBJECT ${PROJECT_SOURCE_DIR}/tests/sanitizers/keep_libraries_loaded.cpp)
  target_link_libraries(mqlm_keep_libraries_loaded PRIVATE mqlm_warnings)
  link_libraries(mqlm_keep_libraries_loaded)
endif()

# TSan: ZeroMQ's hand-over between threads, modelled for TSan (tests/sanitizers/zmq_tsan_model.cpp)
# in every target that links cppzmq, by wrapping the calls that pass a message's bytes.
if(MQLM_SANITIZE STREQUAL "thread")
  add_library(mqlm_zmq_tsan_model STATIC ${PROJECT_SOURCE_DIR}/tests/sanitizers/zmq_tsan_model.cpp)
  target_link_libraries(mqlm_zmq_tsan_model PRIVATE libzmq mqlm_warnings)
  set(wrapped zmq_msg_send zmq_msg_recv zmq_msg_close zmq_msg_init_data zmq_msg_gets)
  list(TRANSFORM wrapped PREPEND "LINKER:--wrap=")
  set_property(TARGET cppzmq APPEND PROPERTY INTERFACE_LINK_OPTIONS ${wrapped})
  set_property(TARGET cppzmq APPEND PROPERTY INTERFACE_LINK_LIBRARIES mqlm_zmq_tsan_model)
endif()
