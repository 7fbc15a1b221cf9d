// tdpipe-view — the Qt viewer of pipeline timelines: a predicted and a measured one, or up
// to eight side by side.
#include "tdpipe/viz/view_command.hpp"

int main(int argc, char** argv) { return tdpipe::viz::run_view(argc, argv); }
