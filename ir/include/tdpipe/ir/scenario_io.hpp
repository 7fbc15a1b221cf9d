// scenario_io.hpp — scenario files (YAML) and GPU presets.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tdpipe/ir/scenario.hpp"

namespace tdpipe::ir {

/// Reads and checks a scenario file. Throws tdpipe::Error "file:line: field: what was expected"
/// for malformed YAML, unknown keys, wrong types and impossible layouts.
Scenario load_scenario(const std::string& path);
/// Same, from text; `source_name` is used in error messages and as the default name.
Scenario parse_scenario(std::string_view yaml_text, const std::string& source_name);
/// Preset by name (a100-80g, a100-40g, h100-80g, h200); throws tdpipe::Error listing the known names.
GpuSpec gpu_preset(std::string_view name);
/// Names of all GPU presets.
std::vector<std::string> gpu_preset_names();

nlohmann::json to_json(const Scenario& scenario);

/// parallel.recompute's names: "none", "selective", "full" (recompute_from reads any
/// other text as none; the readers check the name first).
std::string recompute_name(Recompute recompute);
Recompute recompute_from(const std::string& name);
Scenario scenario_from_json(const nlohmann::json& j);

}  // namespace tdpipe::ir
