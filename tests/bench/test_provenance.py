"""bench.provenance.commit: what every bench records as the tree that ran."""

from __future__ import annotations

import subprocess

from bench import provenance


def _repo(path):
    def git(*args):
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("commit", "-qm", "one")
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_a_tree_that_differs_from_its_commit_says_so(tmp_path):
    head = _repo(tmp_path)
    assert provenance.commit(str(tmp_path)) == head
    (tmp_path / "new.txt").write_text("untracked files are not the code that ran\n")
    assert provenance.commit(str(tmp_path)) == head
    (tmp_path / "a.py").write_text("x = 2\n")  # as a copied tree over an old .git looks
    assert provenance.commit(str(tmp_path)) == head + "+dirty"


def test_asyncrl_commit_names_this_checkout_only(tmp_path, monkeypatch):
    head = _repo(tmp_path)
    monkeypatch.setenv(provenance.ENV, "abc1234")
    assert provenance.commit() == "abc1234"
    assert provenance.commit(provenance.HERE) == "abc1234"  # this checkout, however it is named
    assert provenance.commit(str(tmp_path)) == head  # a --baseline tree answers for itself


def test_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv(provenance.ENV, raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert provenance.commit(str(tmp_path)) == "unknown"
