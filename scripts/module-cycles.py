#!/usr/bin/env python3
"""Fails when a module of a workspace crate imports a module that imports it back.

For every crate (the root package's src/ and each lock-*/src/), every source file is a
module. An edge a -> b is a path in a's code that names an item of module b: `use
crate::b::...`, `crate::b::x(...)`, `super::b::...`, `self::b::...`, `b::x` for a child b.
Re-exports are followed to the module that defines the item (`pub use inner::X` in
lib.rs or mod.rs), so `crate::Locker` counts as an edge to the module defining
`Locker`. Declaring a child (`mod b;`) is not an edge. `#[cfg(test)]` blocks and tests.rs
files are left out: unit tests may use anything. Prints every cycle found, exits 1 if any.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules_of(src):
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith('.rs'):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)[:-3].split(os.sep)
            if rel[-1] in ('lib', 'main', 'mod'):
                rel = rel[:-1]
            if rel and rel[-1] == 'tests':
                continue
            mods[tuple(rel)] = path
    return mods


def strip_tests(text):
    # Drop `#[cfg(test)] mod x { ... }` blocks and comments.
    text = re.sub(r'//[^\n]*', '', text)
    out, i = [], 0
    for m in re.finditer(r'#\[cfg\(test\)\]\s*mod\s+\w+\s*\{', text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {'{': 1, '}': -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return ''.join(out)


DEF = r'(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?(?:unsafe\s+)?(?:fn|struct|enum|trait|type|const|static|mod|macro_rules!)\s+(\w+)'


def analyse(src):
    mods = modules_of(src)
    texts = {m: strip_tests(open(p).read()) for m, p in mods.items()}
    defined = {m: set(re.findall(DEF, t)) for m, t in texts.items()}
    # re-exports: module -> name -> target module (path tuple), and glob children
    reexp, globs = {}, {}
    use_re = re.compile(r'pub(?:\([^)]*\))?\s+use\s+([^;]+);')
    for m, t in texts.items():
        for u in use_re.findall(t):
            for path, name in expand_use(u.replace('\n', ' ')):
                target = resolve(m, path, mods)
                if target is None:
                    continue
                if name == '*':
                    globs.setdefault(m, []).append(target)
                else:
                    reexp.setdefault(m, {})[name] = (target, path)

    def owner(module, name, seen=()):
        """The module defining `name` as seen from `module` (following re-exports)."""
        if (module, name) in seen:
            return module
        seen = seen + ((module, name),)
        if name in reexp.get(module, {}):
            target, _ = reexp[module][name]
            return owner(target, name, seen) if target in mods else target
        if name in defined.get(module, set()):
            return module
        for g in globs.get(module, []):
            if name in defined.get(g, set()) or name in reexp.get(g, {}):
                return owner(g, name, seen)
        return module

    edges = {m: set() for m in mods}
    path_re = re.compile(r'\b((?:crate|super|self)(?:::\w+)+|(?:\w+)(?:::\w+)+)')
    for m, t in texts.items():
        for u in re.findall(r'\buse\s+([^;]+);', t):
            for path, name in expand_use(u.replace('\n', ' ')):
                add_edge(m, path + ([name] if name not in ('*', 'self') else []), mods, owner, edges)
        for p in path_re.findall(t):
            add_edge(m, p.split('::'), mods, owner, edges)
    return mods, edges


def expand_use(u):
    """`a::{b, c::{d, e}}` -> [(['a'], 'b'), (['a','c'], 'd'), ...]."""
    u = u.strip()
    u = re.sub(r'\s+as\s+\w+', '', u)
    m = re.match(r'^(.*?)::\{(.*)\}$', u, re.S)
    if not m:
        parts = u.split('::')
        return [(parts[:-1], parts[-1])] if len(parts) > 1 else []
    base, inner = m.group(1).split('::'), m.group(2)
    items, depth, cur = [], 0, ''
    for ch in inner:
        if ch == ',' and depth == 0:
            items.append(cur)
            cur = ''
            continue
        depth += {'{': 1, '}': -1}.get(ch, 0)
        cur += ch
    items.append(cur)
    out = []
    for it in items:
        it = it.strip()
        if not it:
            continue
        if it == 'self':
            out.append((base[:-1], base[-1]))
            continue
        for p, n in expand_use(it) or [([], it)]:
            out.append((base + p, n))
    return out


def resolve(module, path, mods, with_rest=False):
    """The deepest module a path names (and the segments after it), or None for paths
    outside the crate."""
    if not path:
        return None
    head, rest = path[0], list(path[1:])
    if head == 'crate':
        cur = ()
    elif head == 'super':
        cur = module[:-1]
        while rest and rest[0] == 'super':
            cur, rest = cur[:-1], rest[1:]
    elif head == 'self':
        cur = module
    elif module + (head,) in mods:
        cur = module + (head,)
    else:
        return None
    while rest and cur + (rest[0],) in mods:
        cur, rest = cur + (rest[0],), rest[1:]
    return (cur, rest) if with_rest else cur


def add_edge(m, parts, mods, owner, edges):
    found = resolve(m, parts, mods, with_rest=True)
    if found is None:
        return
    target, rest = found
    if rest:
        target = owner(target, rest[0])
    if target != m and target in mods:
        edges[m].add(target)


def cycles(edges):
    found, state, stack = [], {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for nxt in sorted(edges.get(n, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    return found


def main():
    crates = [('distlock', os.path.join(ROOT, 'src'))]
    for d in sorted(os.listdir(ROOT)):
        if d.startswith('lock-') and os.path.isdir(os.path.join(ROOT, d, 'src')):
            crates.append((d, os.path.join(ROOT, d, 'src')))
    bad = 0
    for name, src in crates:
        mods, edges = analyse(src)
        for c in cycles(edges):
            bad += 1
            print(f"{name}: cycle: {' -> '.join('::'.join(x) or 'crate' for x in c)}")
        if '-v' in sys.argv:
            n = sum(len(e) for e in edges.values())
            print(f"{name}: {len(mods)} modules, {n} edges")
    if bad:
        sys.exit(1)
    print(f"module-cycles: no module imports a module that imports it back ({len(crates)} crates)")


if __name__ == '__main__':
    main()
