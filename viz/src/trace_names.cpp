// trace_names.cpp — default and user names of the viewer's traces (trace_names.hpp).
#include "tdpipe/viz/trace_names.hpp"

#include <QString>
#include <algorithm>
#include <limits>
#include <map>
#include <set>

namespace tdpipe::viz {
namespace {

// Lane labels stay short: a longer name keeps its first characters and "…".
constexpr int kShortNameChars = 18;

std::string abbreviate(const std::string& s) {
  const QString q = QString::fromStdString(s);
  if (q.size() <= kShortNameChars) return s;
  return (q.left(kShortNameChars - 1).trimmed() + QStringLiteral("…")).toStdString();
}

bool distinct(const std::vector<std::string>& v) {
  return std::set<std::string>(v.begin(), v.end()).size() == v.size();
}

bool is_separator(QChar c) {
  return c.isSpace() || c == QLatin1Char('-') || c == QLatin1Char('_') || c == QLatin1Char('/') ||
         c == QLatin1Char('.') || c == QLatin1Char('(') || c == QLatin1Char(')') || c == QLatin1Char(',');
}

// A long name of a group that abbreviate() makes alike ("experiment-long-na…" for
// "experiment-long-name-A" and "…-B"): its head, "…", and the part where the group's
// names part (`common`: the length of their common prefix) — "experiment-…name-A" —
// or, where that part is long itself, a window on it ending in "…" too.
std::string abbreviate_keeping(const std::string& s, int common) {
  const QString q = QString::fromStdString(s);
  const int len = static_cast<int>(q.size());
  if (len <= kShortNameChars) return s;
  // The kept part starts at the first difference, or earlier to show a few characters
  // of its context, at the start of a word where there is one close by.
  int start = std::min(common, std::max(0, len - 6));
  for (int k = start; k > 0 && k > start - 5; --k)
    if (is_separator(q[k - 1])) {
      start = k;
      break;
    }
  while (start < common && is_separator(q[start])) ++start;
  constexpr int kKept = 11;  // at most, of the 18: the head keeps the rest
  QString kept = q.mid(start);
  if (kept.size() > kKept) kept = q.mid(start, kKept - 1).trimmed() + QStringLiteral("…");
  const QString head = q.left(kShortNameChars - 1 - static_cast<int>(kept.size())).trimmed();
  return (head + QStringLiteral("…") + kept).toStdString();
}

int common_prefix(const QString& a, const QString& b) {
  int i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// Lane labels of `names`: each abbreviated, and all distinct, as the names are — two
// names abbreviated alike keep what tells them apart; where even that fails, each starts
// with its trace's number ("3 …").
std::vector<std::string> short_names_for(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const auto& s : names) out.push_back(abbreviate(s));
  if (distinct(out)) return out;
  std::map<std::string, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < out.size(); ++i) groups[out[i]].push_back(i);
  for (const auto& [abbrev, members] : groups) {
    if (members.size() < 2) continue;
    int common = std::numeric_limits<int>::max();
    const QString first = QString::fromStdString(names[members[0]]);
    for (std::size_t k = 1; k < members.size(); ++k)
      common = std::min(common, common_prefix(first, QString::fromStdString(names[members[k]])));
    for (std::size_t i : members) out[i] = abbreviate_keeping(names[i], common);
  }
  if (!distinct(out))
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = abbreviate(std::to_string(i + 1) + " " + names[i]);
  return out;
}

// "runs/a.json.gz" → "a", a Kineto folder "runs/meas/" → "meas".
std::string file_stem(const std::string& path) {
  std::string name = trace_file_name(path);
  for (const char* ext : {".gz", ".json", ".sqlite", ".trace", ".pt"}) {
    const std::string e = ext;
    if (name.size() > e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0)
      name.resize(name.size() - e.size());
  }
  return name;
}

// Chart tags: the first character of each short name, upper-case, where those differ;
// else the trace's number from 1.
std::vector<std::string> tags_for(const std::vector<std::string>& short_names) {
  std::vector<std::string> tags;
  for (const auto& s : short_names) tags.push_back(QString::fromStdString(s).left(1).toUpper().toStdString());
  if (!distinct(tags) || std::any_of(tags.begin(), tags.end(), [](const std::string& t) { return t.empty(); }))
    for (std::size_t i = 0; i < tags.size(); ++i) tags[i] = std::to_string(i + 1);
  return tags;
}

const char* count_word(int n) {
  static const char* words[] = {"no", "one", "two", "three", "four", "five", "six", "seven", "eight"};
  return n >= 0 && n <= 8 ? words[n] : nullptr;
}

}  // namespace

std::string trace_file_name(const std::string& path) {
  std::string p = path;
  // A folder given as "runs/meas/" (or "runs/meas//"): its name, not the empty one after the '/'.
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (p == "/") return p;
  const auto slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

TraceNames default_trace_names(const std::vector<const traces::Trace*>& traces,
                               const std::vector<std::string>& files) {
  TraceNames n;
  const std::size_t count = traces.size();
  if (count <= 2) {
    // One or two traces: a prediction and the run it predicts, as ever.
    const char* names[] = {"predicted", "measured"};
    const char* shorts[] = {"pred", "meas"};
    const char* tags[] = {"P", "M"};
    for (std::size_t i = 0; i < count; ++i) {
      n.name.emplace_back(names[i]);
      n.short_name.emplace_back(shorts[i]);
      n.tag.emplace_back(tags[i]);
    }
    if (count == 2) n.difference = "error";
    return n;
  }
  // More: schedule (with its slice count, read from the ops: "tdpipe S=2") and origin,
  // then the file's base name where two are alike, then the trace's number where they
  // still are.
  std::vector<std::string> schedules;
  for (const auto* t : traces) {
    int slices = 0;
    for (const auto& e : t->events)
      if (e.kind) slices = std::max(slices, e.slice + 1);
    schedules.push_back(t->schedule.empty() || slices <= 1 ? t->schedule
                                                            : t->schedule + " S=" + std::to_string(slices));
  }
  for (std::size_t i = 0; i < count; ++i) {
    const traces::Trace& t = *traces[i];
    std::string s;
    if (!t.schedule.empty()) s = schedules[i] + (t.origin.empty() ? "" : " (" + t.origin + ")");
    else if (!t.origin.empty()) s = t.origin;
    else s = "trace " + std::to_string(i + 1);
    n.name.push_back(s);
  }
  auto alike = [&](std::size_t i) {
    return std::count(n.name.begin(), n.name.end(), n.name[i]) > 1;
  };
  if (files.size() == count) {
    std::vector<bool> ambiguous(count);
    for (std::size_t i = 0; i < count; ++i) ambiguous[i] = alike(i);
    for (std::size_t i = 0; i < count; ++i)
      if (ambiguous[i] && !files[i].empty()) n.name[i] += " " + file_stem(files[i]);
  }
  {
    std::vector<bool> ambiguous(count);
    for (std::size_t i = 0; i < count; ++i) ambiguous[i] = alike(i);
    for (std::size_t i = 0; i < count; ++i)
      if (ambiguous[i]) n.name[i] += " #" + std::to_string(i + 1);
  }
  // Lane labels: the schedule alone where every trace has a schedule of its own.
  const bool by_schedule =
      distinct(schedules) && std::none_of(schedules.begin(), schedules.end(), [](const std::string& s) { return s.empty(); });
  n.short_name = short_names_for(by_schedule ? schedules : n.name);
  n.tag = tags_for(n.short_name);
  return n;
}

TraceNames user_trace_names(const std::vector<std::string>& labels) {
  TraceNames n;
  n.name = labels;
  n.short_name = short_names_for(labels);
  n.tag = tags_for(n.short_name);
  if (labels.size() == 2) n.difference = "change";
  return n;
}

std::string check_trace_labels(const std::vector<std::string>& labels, int traces) {
  const bool empty = std::any_of(labels.begin(), labels.end(), [](const std::string& l) { return l.empty(); });
  if (static_cast<int>(labels.size()) == traces && traces > 0 && !empty && distinct(labels)) return {};
  std::string given;
  for (const auto& l : labels) given += (given.empty() ? "" : ",") + l;
  if (traces <= 0) return "--labels names the traces, one name each, but no trace file was given";
  const char* word = count_word(traces);
  std::string need = traces == 1 ? "one name" : std::string(word ? word : std::to_string(traces).c_str()) + " different names";
  std::string what = "--labels needs " + need;
  if (traces == 2) what += " separated by a comma (e.g. --labels balanced,unbalanced)";
  else if (traces > 2) what += " separated by commas";
  what += ", one per trace (" + std::to_string(traces) + (traces == 1 ? " trace" : " traces") + " given)";
  std::string got;
  if (empty) got = "an empty name";
  else if (!distinct(labels)) got = "a name twice";
  else got = std::to_string(labels.size()) + (labels.size() == 1 ? " name" : " names");
  return what + ", got " + got + " in '" + given + "'";
}

}  // namespace tdpipe::viz
