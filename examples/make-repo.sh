#!/bin/sh
# Turns an example repository into a real git repository kiln can clone:
#   examples/make-repo.sh stats-py /tmp/stats-py
# then submit a build with repo=/tmp/stats-py and the task and verify of examples/tasks/stats-py.json.
set -eu
name=$1
dest=$2
src=$(dirname "$0")/repos/$name
[ -d "$src" ] || { echo "no example repository named '$name' in $(dirname "$0")/repos" >&2; exit 2; }
mkdir -p "$dest"
cp -R "$src"/. "$dest"/
cd "$dest"
git init -q -b main
git add -A
git -c user.name=kiln -c user.email=kiln@localhost commit -q -m "$name: initial import"
echo "$dest"
