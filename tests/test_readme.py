"""The README is the user's guide: its code parses, its commands are CI's, its links resolve."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_python_blocks_parse():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert len(blocks) >= 3
    for block in blocks:
        ast.parse(block)


def test_the_two_commands_are_the_ones_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install ".[cuda12,test]"' in README and 'pip install ".[cuda12,test]"' in ci
    assert "python -m pytest -q" in README and "python -m pytest -q" in ci


def test_relative_links_resolve():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [x for x in links if not re.match(r"[a-z]+://", x)]
    assert local, "the README links its docs"
    for target in local:
        assert (ROOT / target).exists(), target


def test_readme_stays_a_guide():
    assert len(README.splitlines()) <= 360
