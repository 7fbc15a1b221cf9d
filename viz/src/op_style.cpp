// op_style.cpp — colours and labels of ops (one palette for every view and chart).
#include "tdpipe/viz/op_style.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <string>
#include <map>
#include <set>

#include "tdpipe/ir/op.hpp"

namespace tdpipe::viz {
namespace {

// Forward cool, backward warm-green, comm orange/yellow, collectives red, so the
// kinds stay apart and none is close to the bubble shade.
QColor kind_color(ir::OpKind k) {
  switch (k) {
    case ir::OpKind::F: return {0x4c, 0x78, 0xa8};
    case ir::OpKind::B: return {0x59, 0xa1, 0x4f};
    case ir::OpKind::W: return {0x76, 0xb7, 0xb2};
    case ir::OpKind::BW: return {0x2e, 0x7d, 0x32};
    case ir::OpKind::OPT: return {0x6d, 0x4c, 0x9f};
    case ir::OpKind::SEND: return {0xf2, 0x8e, 0x2b};
    case ir::OpKind::RECV: return {0xed, 0xc9, 0x48};
    case ir::OpKind::ALLREDUCE: return {0xc6, 0x28, 0x28};
    case ir::OpKind::REDUCE_SCATTER: return {0xad, 0x14, 0x57};
    case ir::OpKind::ALL_GATHER: return {0xd8, 0x43, 0x15};
    case ir::OpKind::LOAD: return {0x9c, 0x75, 0x5f};
    case ir::OpKind::OFFLOAD: return {0x79, 0x55, 0x48};
    case ir::OpKind::CKPT: return {0x9e, 0x9e, 0x9e};
    case ir::OpKind::COMPRESSED_ALLREDUCE: return {0xe5, 0x73, 0x73};
    // Serving: prefill indigo, decode teal — apart from each other and from training's kinds.
    case ir::OpKind::PREFILL: return {0x3f, 0x51, 0xb5};
    case ir::OpKind::DECODE: return {0x00, 0x96, 0x88};
  }
  return Qt::gray;
}

}  // namespace

QColor op_color(const traces::TraceEvent& e) {
  if (e.kind) {
    // Later chunks (virtual stages) of a compute op in lighter shades of its kind, so that
    // interleaved and ZB-V shapes show: c0 as the kind, c1 lighter, c2 lighter still, …
    const QColor base = kind_color(*e.kind);
    if (!ir::is_compute(*e.kind) || e.chunk <= 0) return base;
    float h, s, v;
    base.getHsvF(&h, &s, &v);
    // c1 0.30, c2 0.45, c3 0.54, … towards 0.75: every chunk a shade of its own.
    const float t = 0.75f * static_cast<float>(e.chunk) / (static_cast<float>(e.chunk) + 1.5f);
    return QColor::fromHsvF(h, s * (1 - t), v + (1 - v) * t * 0.8f);
  }
  // Foreign events: a stable hue from the name, mid saturation and value so that
  // labels stay readable and nothing looks like the bubble shade.
  const auto h = std::hash<std::string>{}(e.name);
  return QColor::fromHsv(static_cast<int>(h % 360), 110 + static_cast<int>((h >> 12) % 60),
                         150 + static_cast<int>((h >> 20) % 60));
}

QColor trace_color(int t, int n) {
  if (n <= 2) return t == 0 ? QColor(0x5b, 0x8f, 0xd4) : QColor(0x4a, 0x4a, 0x4a);
  // Tableau 10's first eight: apart from each other, and the first is the one-trace blue's kin.
  static const QColor palette[] = {{0x4e, 0x79, 0xa7}, {0xf2, 0x8e, 0x2b}, {0x59, 0xa1, 0x4f},
                                   {0xe1, 0x57, 0x59}, {0x76, 0xb7, 0xb2}, {0xb0, 0x7a, 0xa1},
                                   {0xed, 0xc9, 0x48}, {0x9c, 0x75, 0x5f}};
  return palette[static_cast<std::size_t>(std::max(0, t)) % std::size(palette)];
}

QColor trace_text_color(int t, int n) {
  if (n <= 2) return t == 0 ? QColor(0x1f, 0x4e, 0x9a) : QColor(0x20, 0x20, 0x20);
  // Darker than the bars so thin text reads on the light label margin (the yellow most).
  QColor c = trace_color(t, n);
  float h, s, v;
  c.getHsvF(&h, &s, &v);
  return QColor::fromHsvF(h, std::min(1.0f, s * 1.1f + 0.1f), std::min(v, 0.62f));
}

QString op_label(const traces::TraceEvent& e) {
  if (!e.kind) return QString::fromStdString(e.name);
  QString s = QString::fromUtf8(ir::to_string(*e.kind).data(),
                                static_cast<qsizetype>(ir::to_string(*e.kind).size()));
  if (*e.kind == ir::OpKind::SEND || *e.kind == ir::OpKind::RECV) {
    s = (*e.kind == ir::OpKind::SEND ? "S" : "R");
  } else if (ir::is_collective(*e.kind)) {
    switch (*e.kind) {
      case ir::OpKind::ALLREDUCE: s = "AR"; break;
      case ir::OpKind::REDUCE_SCATTER: s = "RS"; break;
      case ir::OpKind::COMPRESSED_ALLREDUCE: s = "AR1b"; break;
      default: s = "AG"; break;
    }
  }
  if (e.mb >= 0) s += QString::number(e.mb);
  if (e.chunk > 0) s += QStringLiteral(".c%1").arg(e.chunk);
  if (e.slice > 0) s += QStringLiteral(":s%1").arg(e.slice);
  return s;
}

QString op_short_label(const traces::TraceEvent& e) {
  if (e.kind && e.mb >= 0) return QString::number(e.mb);
  return {};
}

QColor text_color_on(const QColor& fill) {
  const double lum = 0.299 * fill.redF() + 0.587 * fill.greenF() + 0.114 * fill.blueF();
  return lum > 0.6 ? QColor(Qt::black) : QColor(Qt::white);
}

std::vector<LegendEntry> legend_entries(const std::vector<const traces::Trace*>& traces) {
  std::set<int> kinds;
  bool foreign = false;
  int max_chunk = 0;
  for (const auto* t : traces) {
    if (!t) continue;
    for (const auto& e : t->events) {
      if (e.kind) {
        kinds.insert(static_cast<int>(*e.kind));
        if (ir::is_compute(*e.kind)) max_chunk = std::max(max_chunk, e.chunk);
      } else {
        foreign = true;
      }
    }
  }
  std::vector<LegendEntry> out;
  for (int k : kinds) {
    const auto kind = static_cast<ir::OpKind>(k);
    const auto name = ir::to_string(kind);
    out.push_back({QString::fromUtf8(name.data(), static_cast<qsizetype>(name.size())),
                   kind_color(kind)});
  }
  if (max_chunk > 0) {  // chunks shaded (op_color): say so with F's second chunk
    traces::TraceEvent later;
    later.kind = ir::OpKind::F;
    later.chunk = 1;
    out.push_back({max_chunk == 1 ? QStringLiteral("chunk c1: lighter") : QStringLiteral("chunks c1…c%1: lighter").arg(max_chunk),
                   op_color(later)});
  }
  if (foreign) out.push_back({QStringLiteral("other (by name)"), QColor(0x90, 0xa0, 0xb0)});
  out.push_back({QStringLiteral("idle (bubble)"), kBubbleColor});
  return out;
}

QString format_duration(std::int64_t ns) {
  const double a = std::abs(static_cast<double>(ns));
  const double v = static_cast<double>(ns);
  if (a >= 1e9) return QStringLiteral("%1 s").arg(v / 1e9, 0, 'f', a >= 1e10 ? 1 : 3);
  if (a >= 1e6) return QStringLiteral("%1 ms").arg(v / 1e6, 0, 'f', a >= 1e8 ? 1 : (a >= 1e7 ? 2 : 3));
  if (a >= 1e3) return QStringLiteral("%1 µs").arg(v / 1e3, 0, 'f', a >= 1e5 ? 1 : (a >= 1e4 ? 2 : 3));
  return QStringLiteral("%1 ns").arg(ns);
}

}  // namespace tdpipe::viz
