"""The controller under a changing load: closed-loop phases back to back on
one server, 1 concurrent stream, then 8, then 1 again, against every static
speculative config and against the adaptive controller.

    python -m quickdraft.bench.phases [--phase-seconds 60] [--configs off,p3,p5,p7,ar3,ar5,controller]
        [--statics-from bench/results/sweep/sweep.json] [--out bench/results/phases]
    quickdraft bench phases ...                                   (the same)

Each config gets its own freshly started ``quickdraft serve`` (a child
process, as in the sweep: off, ar1..ar7, p1..p7 and ``controller.enabled=true``),
a few warm-up requests, then the phases without a pause between them: the
controller's server sees the load change. The controller's server first gets
``--controller-warmup`` seconds of load at the first phase's concurrency (it
explores), straight into phase 1. It starts without a profile (a cold start)
unless ``--controller-profile-dir`` names a directory of them (e.g. the one
``quickdraft tune`` wrote), which is copied into --out, never written to.

Request *k* of phase *p* is the same for every config: task k of phase p's own
slice of the tasks (``task_slices``; deterministic by seed and index). Use
``--heldout-packages --tasks 4400`` so that no prompt repeats and no config finds
another phase's prompts in its prefix cache. The workload defaults to no
cancellations and no chat class (``--cancel-share 0 --chat-share 0``),
greedy: TPOT compares like with like.

Per phase, with requests bucketed by the phase they STARTED in (client-side
timings, token-weighted TPOT = decode time / decode tokens):

- the best static config's TPOT and the controller's, over the phase after
  its first ``--settle-seconds`` (30) and over the whole phase; regret =
  controller / best static - 1. Target: within 5 % in every phase after the
  first 30 s. Also when (on a 5-s grid) the controller's TPOT from then to the
  phase's end first came within 5 % of the best static's over the same window;
- with ``--rounds`` 2 or more, beside that minimum of the measured statics
  (biased low: picked and measured on the same requests), a cross-fitted best
  static: for each round, the best on the other rounds, measured on that round;
  the targets use it when there is one (``regret_basis``);
- the same regret against the best static config that met the inline TTFT
  SLO (the controller server's ``controller.ttft_slo_s``), with every
  config's TTFT p95;
- the controller against the seed's fixed config (parallel K=5), as a ratio;
- engine rebuilds (GetControllerState's ``engine_rebuilds``, read at every
  phase boundary, and the switch decisions it lists), and requests that failed
  (any status but OK) in each phase and while a rebuild was under way. Target: 0.

``--reanalyse PHASES_JSON --out DIR`` measures nothing: it recomputes an
earlier run's verdicts and report with this code.

``--statics-from FILE`` (repeatable) takes static configs' figures from an
earlier run's phases.json, or from a sweep.json (the level at each phase's
concurrency), so the controller can be rerun alone; configs measured in this
run win over loaded ones.

Output (``--out``, default bench/results/phases): phases.json (machine, load
averages, versions, command, every config's per-phase figures and per-request
timings, the servers' polled state, the verdicts), phases.md, phases.png
(TPOT over time per config with the phase boundaries and the controller's
switches; per-phase bars), and the servers' logs.
"""
