#!/usr/bin/env bash
# The demo model's corpus: the King James Bible from Debian's bible-kjv-text package (the text is
# out of copyright; the package's data file is "for unrestricted use", see its copyright file),
# dumped with the package's own `bible` program (bible-kjv). Writes, under OUT (default
# .cache/train): kjv.txt (one verse per line, verse numbers and chapter headings dropped),
# train.txt and heldout.txt (every 20th chapter held out). Needs apt (Debian's archive) and
# dpkg; nothing is installed system-wide.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$ROOT/.cache/train}"
mkdir -p "$OUT/deb"
cd "$OUT/deb"
[ -f bible-kjv-text.deb ] || { apt-get download bible-kjv-text bible-kjv >/dev/null 2>&1 \
  || { apt-get update -qq && apt-get download bible-kjv-text bible-kjv; }; \
  mv bible-kjv-text_*.deb bible-kjv-text.deb; mv bible-kjv_*.deb bible-kjv.deb; }
dpkg -x bible-kjv-text.deb text && dpkg -x bible-kjv.deb prog
cp text/usr/share/doc/bible-kjv-text/copyright "$OUT/COPYRIGHT-kjv"
prog/usr/bin/bible -p "$PWD/text/usr/lib" -d bible.data "Gen1:1-Rev22:21" > "$OUT/raw.txt"
python3 - "$OUT" <<'PY'
import re, sys
out = sys.argv[1]
chapters, verse = [], None
for line in open(f"{out}/raw.txt", encoding="utf-8"):
    line = line.rstrip("\n")
    if not line.strip():
        continue
    m = re.match(r"^\s+(\d+) (.*)$", line)
    if re.match(r"^\S.* \d+$", line) and not line.startswith(" "):   # "Genesis 1"
        chapters.append([])
        continue
    if m:
        chapters[-1].append(m.group(2).strip())
    elif chapters and chapters[-1]:
        chapters[-1][-1] += " " + line.strip()   # a wrapped verse
with open(f"{out}/kjv.txt", "w") as all_, open(f"{out}/train.txt", "w") as tr, \
        open(f"{out}/heldout.txt", "w") as ho:
    for i, ch in enumerate(chapters):
        text = "\n".join(ch) + "\n\n"
        all_.write(text)
        (ho if i % 20 == 19 else tr).write(text)
print(f"{len(chapters)} chapters, {sum(map(len, chapters))} verses -> {out}/train.txt, heldout.txt")
PY
wc -c "$OUT/train.txt" "$OUT/heldout.txt"
