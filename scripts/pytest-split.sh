#!/usr/bin/env bash
# pytest-split.sh PYTEST [ARGS...] [-m EXPR]: run what EXPR selects (everything without -m) in two
# pytest sessions: the tests not marked inproc_moto, then those marked inproc_moto (moto's
# in-process mock resets the backends that a local engine's server in the same process serves, so
# the two never share a process). Both halves always run; the exit code is the first failure's.
# A half that selects no test (pytest's exit code 5) is not a failure.
set -u
args=() expr=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-m" ]; then expr="$2"; shift 2; else args+=("$1"); shift; fi
done
sel=${expr:+($expr) and }
rc=0
for half in "not inproc_moto" "inproc_moto"; do
  "${args[@]}" -m "${sel}${half}"
  r=$?
  [ $r -eq 5 ] && r=0
  [ $rc -eq 0 ] && rc=$r
done
exit $rc
