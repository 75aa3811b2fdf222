"""python3 -m tpscope.run [--out DIR] SCRIPT [ARGS...]: runs an unchanged Python training script, recorded.

Starts the recorder from the environment (TPSCOPE_OUT, or --out DIR; torchrun's RANK / WORLD_SIZE / LOCAL_RANK),
installs the hooks (tpscope.instrument()), then runs SCRIPT as `python3 SCRIPT ARGS` would: as __main__, with
sys.argv = [SCRIPT, ARGS...] and the script's folder first on sys.path. `tpscope capture -- python3 SCRIPT ARGS`
runs every rank this way; under torchrun it is `torchrun --nproc-per-node N -m tpscope.run SCRIPT ARGS` with
TPSCOPE_OUT set (then `tpscope merge DIR`).

Exit status and ranks.exit_reason, as tpscope-train's (so capture reads a Python rank's end the same way): the
script's own status (SystemExit; 2 for argparse's usage errors); 3 when an exception follows a collective that timed
out or failed (reason "timeout" / "collective failed"; the process leaves without teardown, its peers may be stuck in
the group); 5 when the ranks agreed to stop on non-finite values (tpscope's health policy); 1 for any other uncaught
exception (reason "error"); 130 on KeyboardInterrupt.
"""

import os
import runpy
import sys
import traceback

USAGE = "usage: python3 -m tpscope.run [--out DIR] SCRIPT [ARGS...]"
EXIT_COLLECTIVE = 3


def _parse(argv):
    out = None
    while argv and argv[0].startswith("-"):
        if argv[0] in ("-h", "--help"):
            print(USAGE)
            print(__doc__.split("\n\n", 1)[1])
            sys.exit(0)
        if argv[0] == "--out" and len(argv) > 1:
            out, argv = argv[1], argv[2:]
        elif argv[0].startswith("--out="):
            out, argv = argv[0][len("--out="):], argv[1:]
        else:
            sys.stderr.write("tpscope.run: unknown option %s\n%s\n" % (argv[0], USAGE))
            sys.exit(2)
    if not argv:
        sys.stderr.write(USAGE + "\n")
        sys.exit(2)
    return out, argv


def main(argv=None):
    out, argv = _parse(list(sys.argv[1:] if argv is None else argv))
    script = argv[0]
    if out:
        os.environ["TPSCOPE_OUT"] = out
    import tpscope
    from tpscope import _collectives
    from tpscope._native import kinds
    if not os.environ.get("TPSCOPE_OUT"):
        sys.stderr.write("tpscope.run: TPSCOPE_OUT is not set (and no --out): running %s unrecorded\n" % script)
    tpscope.start()
    tpscope.instrument()
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code, reason = 0, "ok"
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            sys.stderr.write("%s\n" % e.code)
            code = 1
        reason = "ok" if code == 0 else "exit status %d" % code
    except KeyboardInterrupt:
        code, reason = 130, "interrupted"
    except BaseException:
        traceback.print_exc()
        code, reason = 1, "error"
        if _collectives.FAILURES:
            timed_out = _collectives.FAILURES[-1][3] == kinds.STATE_TIMED_OUT
            tpscope.stop("timeout" if timed_out else "collective failed")
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(EXIT_COLLECTIVE)  # peers may be stuck inside the group: no teardown
    tpscope.stop(reason)
    return code


if __name__ == "__main__":
    sys.exit(main())
