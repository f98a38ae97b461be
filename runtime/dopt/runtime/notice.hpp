#pragma once
// Notes for the user that are not errors, e.g. "a checkpoint file without
// checksums was loaded unverified". By default each note is one line
// "dopt: note: TEXT" on stderr; a program can route them elsewhere (its own
// log) or silence them. Callable from any thread; the handler is called on
// the thread that raised the note, one note at a time.
#include <functional>
#include <string>

namespace dopt {

using NoticeHandler = std::function<void(const std::string& text)>;

/// Installs h (nullptr: notes are dropped) and returns the previous handler.
NoticeHandler set_notice_handler(NoticeHandler h);
/// Passes text to the handler.
void notice(const std::string& text);
/// notice(text), unless this process has raised the same text before.
void notice_once(const std::string& text);

}  // namespace dopt
