# Sourced by the shell tests that gather failures rather than stop at the first: fail DESCRIPTION
# [FILES TO SHOW...] counts one and shows the files' last lines; end_checks MESSAGE prints MESSAGE
# when none failed and exits 1 when any did.
failures=0
fail() {
  echo "FAIL: $1"
  shift
  for f in "$@"; do [[ -f $f ]] && { echo "--- $f"; tail -n 40 "$f"; }; done
  failures=$((failures + 1))
}
end_checks() {
  [[ $failures -eq 0 ]] && echo "$1"
  exit $((failures > 0))
}
