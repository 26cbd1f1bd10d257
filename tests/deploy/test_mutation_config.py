"""tools/mutation.toml and tools/mutation_equivalent.toml stay consistent with the tree.

The mutation run itself needs Cosmic Ray (the `mutation` extra) and minutes per module; these
checks need neither, so a renamed test file or a stale equivalent entry fails here first.
"""

import ast
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("relay_mutation_tool", ROOT / "tools" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_configured_module_and_test_file_exists():
    settings, modules = _tool().load_config()
    assert 0 < settings["threshold"] <= 100
    assert set(modules) >= {"relay/server/room.py", "relay/server/history.py", "relay/protocol.py",
                            "relay_core/token.py", "relay/config.py"}
    for module, tests in modules.items():
        assert (ROOT / module).is_file(), module
        assert tests, module
        for t in tests:
            assert (ROOT / t).is_file(), f"{module}: {t}"


def test_equivalent_entries_name_a_configured_module_a_line_of_it_and_a_reason():
    tool = _tool()
    _, modules = tool.load_config()
    for entry in tool.load_equivalent():
        assert entry["file"] in modules, entry
        assert entry["operator"].startswith("core/"), entry
        assert len(entry["why"]) > 10, entry
        lines = [line for line in (ROOT / entry["file"]).read_text().splitlines()
                 if line.strip() == entry["code"]]
        assert lines, f"no line of {entry['file']} reads {entry['code']!r}: re-check the entry"
        if "column" in entry:
            assert all(entry["column"] < len(line) for line in lines), entry


def test_the_token_size_constants_the_equivalent_list_relies_on():
    # The entries for relay_core/token.py hold because these sums have no common set bits.
    from relay_core import token

    fixed = token.HEADER_SIZE + token.NONCE_SIZE + token._FIXED_PLAINTEXT
    assert fixed & 2 == 0 and (fixed + 2) & token.TAG_SIZE == 0
    assert fixed < 2 * token.MAX_NAME_BYTES
    assert fixed + 2 * token.MAX_NAME_BYTES < token.MAX_USER_DATA
    assert (fixed + 2 * token.MAX_NAME_BYTES + token.MAX_USER_DATA) & token.TAG_SIZE == 0


def test_changed_lines_reads_added_and_changed_lines_from_a_zero_context_diff(monkeypatch):
    tool = _tool()
    diff = ("@@ -10,0 +11,3 @@ def f():\n+a\n+b\n+c\n"
            "@@ -40 +43 @@\n-x\n+y\n"
            "@@ -50,2 +52,0 @@\n-gone\n-gone\n")

    class Done:
        stdout = diff

    monkeypatch.setattr(tool.subprocess, "run", lambda *a, **k: Done())
    assert tool.changed_lines("HEAD~1", "relay/server/room.py") == {11, 12, 13, 43}


def test_an_equivalent_entry_matches_its_line_wherever_it_moved():
    tool = _tool()
    entry = {"file": "relay/x.py", "code": "if a < b:", "column": 9,
             "operator": "core/ReplaceComparisonOperator_Lt_LtE", "why": "because"}
    source = ["def f(a, b):", "    x = 1", "    if a < b:", "        return 1"]

    def mutant(line, column=9, operator=entry["operator"], file="relay/x.py"):
        return tool.Mutant("job", file, line, column, operator, 0)

    assert tool.equivalent_entry(mutant(3), [entry], source) is entry
    assert tool.equivalent_entry(mutant(3), [entry], ["", ""] + source) is None   # now line 5
    assert tool.equivalent_entry(mutant(5), [entry], ["", ""] + source) is entry
    assert tool.equivalent_entry(mutant(3, column=4), [entry], source) is None
    assert tool.equivalent_entry(mutant(3, operator="core/NumberReplacer"), [entry], source) is None
    assert tool.equivalent_entry(mutant(3, file="relay/y.py"), [entry], source) is None
    changed = ["def f(a, b):", "    x = 1", "    if a < b + 1:"]
    assert tool.equivalent_entry(mutant(3), [entry], changed) is None
    any_column = {key: value for key, value in entry.items() if key != "column"}
    assert tool.equivalent_entry(mutant(3, column=4), [any_column], source) is any_column


def test_mutants_inside_annotations_are_found_only_under_postponed_annotations():
    tool = _tool()
    source = ("from __future__ import annotations\n"
              "def f(a: int | None, b=1 + 2) -> str | None:\n"
              "    x: list[int] = [a | b]\n"
              "    return x\n")
    spans = tool.annotation_spans(source)

    def at(line, column):
        return tool.in_annotation(tool.Mutant("job", "m.py", line, column, "op", 0), spans)

    line2, line3 = source.splitlines()[1], source.splitlines()[2]
    assert at(2, line2.index("| None,")) and at(2, line2.index("| None:"))
    assert not at(2, line2.index("+ 2"))                     # a default value is evaluated
    assert at(3, line3.index("list")) and not at(3, line3.index("| b"))
    assert tool.annotation_spans(source.replace("from __future__ import annotations\n", "")) == []


def test_the_tool_parses():
    ast.parse((ROOT / "tools" / "mutation.py").read_text())


def test_a_module_compiled_from_its_source_is_copied_without_its_extension():
    import importlib.machinery

    tool = _tool()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    files = ["relay/server/room.py", "relay/server/room.pxd", f"relay/server/room{suffix}",
             f"relay/frames{suffix}", f"relay_core/peer{suffix}", "relay/server/roomy.py"]
    assert tool.without_extension_of("relay/server/room.py", files) == [
        "relay/server/room.py", "relay/server/room.pxd", f"relay/frames{suffix}", f"relay_core/peer{suffix}",
        "relay/server/roomy.py"]
    assert tool.without_extension_of("relay/server/history.py", files) == files


def test_the_copied_tree_holds_every_extension_setup_py_builds():
    # Subpackages too: a copy without relay/server's extensions cannot import the server.
    tool = _tool()
    files = tool.tree_files()
    for name in re.findall(r'Extension\("([\w.]+)"', (ROOT / "setup.py").read_text()):
        stem = name.replace(".", "/") + "."
        assert any(f.startswith(stem) and f.endswith(".so") for f in files), name
