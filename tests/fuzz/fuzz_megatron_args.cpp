// fuzz_megatron_args.cpp — `tdpipe import megatron`'s argument reader (ir::import_megatron),
// the input split at whitespace into arguments.
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "tdpipe/ir/megatron_import.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return tdpipe::fuzz::run(data, size, [](std::string_view text) {
    std::istringstream in{std::string(text)};
    std::vector<std::string> args;
    for (std::string w; in >> w;) args.push_back(w);
    tdpipe::ir::MegatronCluster c;
    c.gpus = 64;
    tdpipe::ir::import_megatron(args, c);
  });
}
