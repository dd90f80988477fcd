"""Which kernels of two builds of a library differ in SASS (addresses and encodings stripped), with instruction
counts. usage: python sass_diff.py OLD.so NEW.so (needs cuobjdump and c++filt)."""
import re
import subprocess
import sys


def functions(lib):
    text = subprocess.run(f"cuobjdump -sass {lib} | c++filt", shell=True, capture_output=True, text=True).stdout
    out, name = {}, None
    for line in text.splitlines():
        if "Function :" in line:
            name = line.split("Function :", 1)[1].strip()
            out[name] = []
        elif name and re.search(r"/\*[0-9a-f]{4,}\*/", line):
            ins = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).split(";")[0].strip()
            out[name].append(re.sub(r"\s+", " ", ins))
    return out


old, new = functions(sys.argv[1]), functions(sys.argv[2])
same = [f for f in new if f in old and old[f] == new[f]]
print(f"{len(new)} kernels, {len(same)} identical; differing (old -> new instructions):")
for f in new:
    if f not in same:
        print(f"  {f[:150]}: {len(old.get(f, []))} -> {len(new[f])}")
