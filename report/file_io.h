// Files the report side reads and writes, done so that nothing hangs, nothing
// half-written is left under a report's name, and every failure is told.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace memledger::report {

// Reads a whole regular file (at most max_bytes). A FIFO, a device or a
// folder is refused without being read, so a reader never blocks on a pipe
// that someone named like a run file; a file larger than max_bytes is
// refused before any of it is read. Returns false and sets `error`
// ("PATH: why") when it cannot be read.
bool read_regular_file(const std::string& path, std::string& out, std::string& error,
                       size_t max_bytes = size_t{64} << 20);

// Reads the first max_bytes (or fewer, when the file is shorter) of a regular
// file, refusing what read_regular_file refuses: enough to tell what a file
// is (a JSON report or a trace, a script's "#!" line) without reading it all.
bool read_regular_file_start(const std::string& path, std::string& out, std::string& error, size_t max_bytes);

// Writes `content` to PATH as a new 0600 file: first to PATH.tmp (created
// afresh, never through a symlink), synced, then renamed over PATH. On any
// failure (a full disk, a write, sync or close error) the temporary file is
// removed, PATH keeps what it held before, and the message says why.
bool write_private_file(const std::string& path, std::string_view content, std::string& error);

// Replaces the content of PATH, a file that exists (never through a
// symlink), in place: for a full disk, where a file written earlier holds
// the space that a new file could not get.
bool overwrite_private_file(const std::string& path, std::string_view content, std::string& error);

// Writes `content` to a file the user named (created with the umask's mode,
// or a device such as /dev/stdout), checking every write and the close; a
// regular file that could not be written whole is removed.
bool write_user_file(const std::string& path, std::string_view content, std::string& error);

// Writes `content` to a stdio stream and flushes it; false (and `error`) when
// any of it did not get through (a full disk behind a redirection, a closed pipe).
bool write_stream(std::FILE* stream, std::string_view content, std::string& error);

}  // namespace memledger::report
