#!/usr/bin/env python3
"""How big the rooms of the house are (docs/design.md, "Room sizes").

Prints the README's length, servesim_main.cc's, every C++ source over the
file limit and every function over the function limit, and with --check
exits 1 when one of them is past its limit. The device cycle models and
functional kernels (devices/<kind>/<kind>_device.cc) are listed but exempt:
a paper's cycle model reads best as the paper's sections in one file.

Functions are found by a brace scanner, not a compiler: comments, string
and character literals are blanked, then each `{` whose header (the text
since the previous `;`, `{` or `}`) ends in `)` plus qualifiers or a
constructor's initialiser list opens a function body, unless it is a
control statement or sits inside another function (a lambda counts toward
its function). A function's length is its lines from the header's first
line to the closing brace.

Usage: scripts/layout.py [--check] [--top N]
"""
import argparse
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

README_MAX = 400
MAIN_MAX = 300
FILE_MAX = 900
FUNCTION_MAX = 150

SOURCE_DIRS = ["agents", "bench", "cluster", "common", "devices", "metrics", "reports",
               "scenario", "scheduler", "services", "studies", "tests", "workload"]
EXTENSIONS = (".cc", ".h")
CONTROL = re.compile(r"\b(if|for|while|switch|catch|do|else|try)\s*(\(|$)")
KEYWORD_AGGREGATE = re.compile(r"\b(class|struct|union|enum|namespace)\b")
QUALIFIERS = re.compile(
    r"^(\s|const|override|final|noexcept(\([^()]*\))?|mutable|volatile|&|&&|"
    r"->\s*[\w:<>,\s*&]+|ABSL_\w+(\([^()]*\))?)*$")


def is_device_model(rel):
    """devices/<kind>/<kind>_device.{cc,h}: a device's cycle model and kernel (exempt)."""
    parts = rel.split(os.sep)
    return (len(parts) == 3 and parts[0] == "devices" and
            re.match(r"^%s_device\.(cc|h)$" % re.escape(parts[1]), parts[2]) is not None)


def blank_literals(text):
    """Comments, strings and character literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if m:
                end = text.find(")" + m.group(1) + '"', i)
                j = n if end < 0 else end + len(m.group(1)) + 2
                out.append(re.sub(r"[^\n]", " ", text[i:j]))
                i = j
            else:
                out.append(c)
                i += 1
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")  # a digit separator (1'000)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(n, j + 1)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "#" and (i == 0 or text[i - 1] == "\n"):
            # A preprocessor line (with its continuations) holds no body.
            j = i
            while True:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                    break
                if text[k - 1] != "\\":
                    break
                j = k + 1
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
        else:
            out.append(c)
            i += 1
    return "".join(out)


def header_opens_function(header):
    h = " ".join(header.split())
    if not h or "=" in re.sub(r"(operator\s*[=!<>+\-*/%&|^]+|==|!=|<=|>=)", "", h.split("(")[0]):
        return False
    if CONTROL.search(h.split("(")[0] + "(") and re.match(r"^(\}?\s*)?(if|for|while|switch|catch|do|else|try)\b", h):
        return False
    if KEYWORD_AGGREGATE.search(h.split("(")[0]) and "(" not in h:
        return False
    if ")" not in h:
        return h.endswith("try")
    # A constructor's initialiser list: `) : a_(x), b_{y} {`.
    depth, last_close = 0, -1
    for k, ch in enumerate(h):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                last_close = k
    tail = h[last_close + 1:]
    if re.match(r"^\s*(const\s*|noexcept\s*|override\s*)*:\s*[\w:]", tail):
        return True
    return bool(QUALIFIERS.match(tail))


def functions(text):
    """(first line, last line, name) of every function body outside another."""
    clean = blank_literals(text)
    found = []
    stack = []  # per open brace: True if it opens a function body
    start = 0  # where the current header began
    in_function = 0
    line_of = [0] * (len(clean) + 1)
    line = 1
    for k, ch in enumerate(clean):
        line_of[k] = line
        if ch == "\n":
            line += 1
    line_of[len(clean)] = line
    for k, ch in enumerate(clean):
        if ch == "{":
            header = clean[start:k]
            opens = in_function == 0 and header_opens_function(header)
            if opens:
                first = start + len(header) - len(header.lstrip())
                name = re.findall(r"([~\w:]+)\s*\(", header)
                stack.append((True, line_of[first], name[0] if name else "?"))
                in_function += 1
            else:
                stack.append((False, 0, ""))
            start = k + 1
        elif ch == "}":
            if stack:
                opens, first, name = stack.pop()
                if opens:
                    in_function -= 1
                    found.append((first, line_of[k], name))
            start = k + 1
        elif ch == ";":
            start = k + 1
    return found


def sources():
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d not in ("node_modules", "corpus", "testdata")]
            for f in sorted(filenames):
                if f.endswith(EXTENSIONS):
                    path = os.path.join(dirpath, f)
                    yield os.path.relpath(path, ROOT), path


def count_lines(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return sum(1 for _ in f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a limit is passed")
    ap.add_argument("--top", type=int, default=10, help="also list the N longest files and functions")
    args = ap.parse_args()

    over = []
    readme = count_lines(os.path.join(ROOT, "README.md"))
    main_cc = count_lines(os.path.join(ROOT, "services", "servesim_main.cc"))
    print(f"README.md                       {readme:5d} lines (limit {README_MAX})")
    print(f"services/servesim_main.cc       {main_cc:5d} lines (limit {MAIN_MAX})")
    if readme > README_MAX:
        over.append("README.md")
    if main_cc > MAIN_MAX:
        over.append("services/servesim_main.cc")

    files, funcs = [], []
    for rel, path in sources():
        n = count_lines(path)
        files.append((n, rel))
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for first, last, name in functions(text):
            funcs.append((last - first + 1, rel, first, name))
    files.sort(reverse=True)
    funcs.sort(reverse=True)

    print(f"\nsource files over {FILE_MAX} lines (device models exempt):")
    any_file = False
    for n, rel in files:
        if n > FILE_MAX:
            exempt = is_device_model(rel)
            any_file = True
            print(f"  {n:5d}  {rel}{'  (device model: exempt)' if exempt else ''}")
            if not exempt:
                over.append(rel)
    if not any_file:
        print("  none")
    print(f"\nfunctions over {FUNCTION_MAX} lines (device models exempt):")
    any_func = False
    for n, rel, first, name in funcs:
        if n > FUNCTION_MAX:
            exempt = is_device_model(rel)
            any_func = True
            print(f"  {n:5d}  {rel}:{first} {name}{'  (device model: exempt)' if exempt else ''}")
            if not exempt:
                over.append(f"{rel}:{first} {name}")
    if not any_func:
        print("  none")
    if args.top > 0:
        print(f"\nthe {args.top} longest non-device files:")
        for n, rel in [f for f in files if not is_device_model(f[1])][: args.top]:
            print(f"  {n:5d}  {rel}")
        print(f"the {args.top} longest non-device functions:")
        for n, rel, first, name in [f for f in funcs if not is_device_model(f[1])][: args.top]:
            print(f"  {n:5d}  {rel}:{first} {name}")
    print(f"\n{len(files)} files, {len(funcs)} functions; "
          f"{len(over)} past a limit" + (": " + ", ".join(over) if over else ""))
    if args.check and over:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
