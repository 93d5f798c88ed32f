"""The benchmarks, run from a checkout (not installed); nothing in the product imports them.

Layers, each importing only those below it:
  cases, timing, peers, targets, cli, results   what is run, how it is timed and judged, the
                                                command lines' and result files' plumbing
  kernels, host, compiled, memory,              one runner each, writing a result file;
  users_shapes, attention, e2e_transformers,    none imports another
  profile_points, split_probe, block_stages
  report, docs_blocks                           Markdown and plots from result files
  bench, run_all                                command lines that run several runners
"""
