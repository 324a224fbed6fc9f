// The report as one self-contained HTML page: inline SVG charts and inline
// CSS, no script and no network (a Content-Security-Policy forbids both), so
// it opens the same in any browser, offline, attached to a ticket or a CI
// artifact. Every string that came from the traced process (commands,
// function, file and module names, step labels) is escaped.
#pragma once

#include <string>
#include <string_view>

#include "run_report.h"

namespace memledger::report {

// Text for HTML element content and quoted attribute values: & < > " ' are
// replaced by character references; bytes that are not valid UTF-8 and
// control characters other than tab and newline become U+FFFD.
std::string html_escape(std::string_view text);

std::string render_html(const RunReport& run);

}  // namespace memledger::report
