// side_names.cpp — the viewer's names for its two traces (side_names.hpp).
#include "tdpipe/viz/side_names.hpp"

namespace tdpipe::viz {
namespace {

SideNames& names() {
  static SideNames n;
  return n;
}

}  // namespace

const SideNames& side_names() { return names(); }

void set_side_names(const QString& first, const QString& second) {
  SideNames& n = names();
  const QString both[2] = {first, second};
  for (int s = 0; s < 2; ++s) {
    n.name[s] = both[s];
    n.short_name[s] = both[s];
    n.tag[s] = both[s].left(1).toUpper();
  }
  if (n.tag[0] == n.tag[1]) n.tag[0] = QStringLiteral("1"), n.tag[1] = QStringLiteral("2");
  n.difference = QStringLiteral("change");
}

void reset_side_names() { names() = SideNames{}; }

}  // namespace tdpipe::viz
