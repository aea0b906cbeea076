// troupe-trace-merge OUT IN...: merges trace files into one (docs/tracing.md). Each input
// is a per-process file (its recorded clock offset against rank 0 is applied) or a file
// troupe-run merged already (taken as it is), e.g. the merged traces of every node of a
// multi-node run.
#include <cstdio>
#include <string>
#include <vector>

#include <troupe/core/trace.hpp>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: troupe-trace-merge OUT.json IN.json...\n"
                 "merges troupe trace files (per-process or merged per node) into one trace;\n"
                 "open it in https://ui.perfetto.dev or chrome://tracing\n");
    return 2;
  }
  std::vector<std::string> inputs(argv + 2, argv + argc);
  auto r = troupe::trace::merge_files(inputs, argv[1]);
  if (!r) {
    std::fprintf(stderr, "troupe-trace-merge: %s\n", r.error().message().c_str());
    return 1;
  }
  std::printf("merged %zu files, %zu events into %s\n", r->files, r->events, argv[1]);
  return 0;
}
