#!/bin/sh
# Checks wordcount against known answers; exits non-zero on the first mismatch.
set -u
fail=0
check() {
  got=$(printf "$1" | ./wordcount)
  if [ "$got" != "$2" ]; then
    echo "FAIL: input '$1': expected '$2', got '$got'"
    fail=1
  else
    echo "ok: '$1' -> $got"
  fi
}
check 'one two three\n' '1 3 14'
check 'tabs\tbetween\twords\n' '1 3 19'
check 'two\nlines\n' '2 2 10'
check '  leading and trailing  \n' '1 3 25'
check '' '0 0 0'
exit $fail
