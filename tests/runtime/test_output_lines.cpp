// print_line (runtime/logging.h): while a command that stops at safe points runs, output nobody
// reads never holds the process (mpirun stops reading its ranks' output once it is signalled):
// lines are dropped, counted, and the count reported once the reader is back; otherwise a slow
// reader holds the writer as usual and loses nothing. A forked child writes into a pipe that the
// test reads only when it chooses.
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/logging.h"
#include "runtime/stop.h"

using namespace meshrt;

namespace {

// A child whose stdout is a pipe: it prints three pipes' worth of ~100-byte lines with graceful
// stops on or off, says "done" on a control pipe, waits for "go" and prints "after".
struct Child {
  pid_t pid = -1;
  int out = -1, done = -1, go = -1;
  int lines = 0;  // three times what the pipe holds
};

std::string numbered(int i) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "line %06d %s\n", i, std::string(85, 'x').c_str());
  return buf;
}

Child start(bool graceful, bool graceful_after = true) {
  int out[2], done[2], go[2];
  REQUIRE(::pipe(out) == 0);
  (void)::fcntl(out[1], F_SETPIPE_SZ, 65536);  // the usual size, wherever the default differs
  const int pipe_bytes = ::fcntl(out[1], F_GETPIPE_SZ);
  REQUIRE(pipe_bytes > 0);
  const int lines = 3 * pipe_bytes / static_cast<int>(numbered(0).size());
  REQUIRE(::pipe(done) == 0);
  REQUIRE(::pipe(go) == 0);
  std::cout.flush();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(out[0]);
    ::close(done[0]);
    ::close(go[1]);
    if (::dup2(out[1], STDOUT_FILENO) < 0) _exit(3);
    ::close(out[1]);
    set_graceful_stop(graceful);
    for (int i = 0; i < lines; ++i) print_line(std::cout, numbered(i));
    char c = 'd';
    if (::write(done[1], &c, 1) != 1 || ::read(go[0], &c, 1) != 1) _exit(4);
    if (!graceful_after) set_graceful_stop(false);  // the command's stop handling has ended
    print_line(std::cout, "after\n");
    _exit(0);
  }
  ::close(out[1]);
  ::close(done[1]);
  ::close(go[0]);
  return {pid, out[0], done[0], go[1], lines};
}

// Whether fd has something to read (or EOF) within ms.
bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

std::string read_some(int fd) {
  char buf[65536];
  const ssize_t n = ::read(fd, buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

int finish(Child& c, std::string* text) {
  char g = 'g';
  REQUIRE(::write(c.go, &g, 1) == 1);
  for (std::string s; readable(c.out, 60000) && !(s = read_some(c.out)).empty();) *text += s;
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  ::close(c.out);
  ::close(c.done);
  ::close(c.go);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("print_line drops output nobody reads during a graceful-stop run, and says so",
          "[logging]") {
  // The note comes with the next line the reader takes, whether the run still goes on or its
  // stop handling has ended (a blocking line after it then still reports the loss).
  const bool graceful_after = GENERATE(true, false);
  Child c = start(true, graceful_after);
  const int lines = c.lines;
  // Nothing is read until the child is done: it must finish by itself (it would block forever
  // without the drop policy).
  REQUIRE(readable(c.done, 120000));
  std::string text;
  while (readable(c.out, 0)) text += read_some(c.out);
  REQUIRE(finish(c, &text) == 0);
  const std::vector<std::string> got = split_lines(text);
  REQUIRE(got.size() >= 3);
  size_t k = 0;
  while (k < got.size() && got[k].rfind("line ", 0) == 0) {
    CHECK(got[k] + "\n" == numbered(static_cast<int>(k)));  // whole lines, in order, none skipped
    ++k;
  }
  REQUIRE(k >= 1);
  REQUIRE(k < static_cast<size_t>(lines));
  REQUIRE(got.size() == k + 2);
  CHECK(got[k] == "meshrt: " + std::to_string(lines - static_cast<int>(k)) +
                      " output line(s) dropped: nothing read this output for " +
                      std::to_string(kOutputStallMs) + " ms while the run went on");
  CHECK(got[k + 1] == "after");
}

TEST_CASE("print_line holds the writer for a slow reader outside graceful-stop runs", "[logging]") {
  Child c = start(false);
  const int lines = c.lines;
  // The child cannot be done before this side reads: the lines are more than the pipe holds.
  CHECK_FALSE(readable(c.done, 1000));
  std::string text;
  while (!readable(c.done, 0)) {
    if (readable(c.out, 100)) text += read_some(c.out);
  }
  std::string rest;
  REQUIRE(finish(c, &rest) == 0);
  const std::vector<std::string> got = split_lines(text + rest);
  REQUIRE(got.size() == static_cast<size_t>(lines) + 1);
  for (int i = 0; i < lines; ++i) CHECK(got[static_cast<size_t>(i)] + "\n" == numbered(i));
  CHECK(got.back() == "after");
}
