#!/bin/bash
# "Builds" the static site into public/.
set -e
cd "$(dirname "$0")"
rm -rf public
mkdir public
cp site/* public/
cp VERSION public/version.txt
echo "built public/ ($(ls public | wc -l) files)"
