// tdpipe-view — the Qt viewer of predicted vs measured pipeline timelines.
#include "tdpipe/viz/view_command.hpp"

int main(int argc, char** argv) { return tdpipe::viz::run_view(argc, argv); }
