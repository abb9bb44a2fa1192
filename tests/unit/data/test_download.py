"""`raymm data download` against a local HTTP server on 127.0.0.1 (no other address is used).

The server serves `www/` as files, `/cut/<name>` as a response that announces the whole file
but stops halfway, and a 404 for anything missing. Every failure must be one line on stderr
(exit 2) and leave nothing in the download folder: no file, no hidden `.part` file.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import threading
from pathlib import Path

import pytest

from raymm.app.cli import main
from raymm.data import download as dl
from raymm.data.download import download, manifest_sha256
from raymm.data.prepare import prepare
from raymm.data.releases import SOURCES, mnist
from raymm.data.releases.common import Contents, Remote, Source
from raymm.errors import DataError, RaymmError

from tiny_releases import hapt_raw, mnist_release, zip_tree

PAYLOAD = bytes(range(256)) * 5000  # 1.28 MB: several read chunks
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()
HAPT_FILES = r"(acc|gyro)_exp\d+_user\d+\.txt|labels\.txt"


class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):  # noqa: N802
        _Handler.requests.append(self.path)
        if self.path.startswith("/cut/"):  # announce the whole file, send half, hang up
            data = (Path(self.directory) / self.path[len("/cut/"):]).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
            return
        super().do_GET()


@pytest.fixture
def www(tmp_path: Path) -> Path:
    folder = tmp_path / "www"
    folder.mkdir()
    (folder / "release.zip").write_bytes(PAYLOAD)
    return folder


@pytest.fixture
def server(www, monkeypatch):
    """Serves `www` at http://127.0.0.1:<port>/; proxies are switched off."""
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    _Handler.requests = []
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Handler, directory=str(www)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "data"


def _cli(*argv: str) -> int:
    """`raymm data download ...` through the real entry point: errors -> one line, exit 2."""
    return main(["data", "download", *argv, "--no-progress"])


def _listing(folder: Path) -> list[str]:
    """Everything in the folder, hidden temp files included."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("raymm: "), err
    return err.strip()


def _source(monkeypatch, name: str, files: tuple[Remote, ...], **kw) -> Source:
    src = Source(name=name, title=name, homepage="", licence="", files=files,
                 prepare=kw.pop("prepare", ()), **kw)
    monkeypatch.setitem(SOURCES, name, src)
    return src


# --------------------------------------------------------------------------- success

def test_pinned_file_downloads_verified_and_says_what_is_next(server, out, capsys, monkeypatch):
    _source(monkeypatch, "tiny", (Remote("tiny.zip", (f"{server}/release.zip",), DIGEST),),
            prepare=("uci-har",))
    assert _cli("tiny", "--out", str(out)) == 0
    dest = out / "tiny.zip"
    assert dest.read_bytes() == PAYLOAD and _listing(out) == ["tiny.zip"]
    text = capsys.readouterr().out
    assert f"downloaded: {dest} (1.2 MiB)" in text
    assert f"sha256 {DIGEST} (verified: the pinned SHA-256)" in text
    assert f"next: raymm data prepare uci-har --from {dest}" in text
    # present already: nothing fetched, the checksum is checked again
    assert _cli("tiny", "--out", str(out)) == 0
    assert f"already present: {dest}" in capsys.readouterr().out
    assert _Handler.requests == ["/release.zip"]


def test_real_source_through_a_mirror_url_and_own_checksum(server, out, monkeypatch, capsys):
    monkeypatch.setenv("RAYMM_DATA", str(out))
    assert _cli("uci-har", "--url", f"{server}/release.zip", "--sha256", DIGEST.upper()) == 0
    text = capsys.readouterr().out
    assert f"downloaded: {out / 'uci_har_dataset.zip'}" in text
    assert "next: raymm data prepare uci-har\n" in text  # the default place: no --from needed


def test_archive_verified_by_the_files_it_must_contain(server, www, out, tmp_path, monkeypatch,
                                                      capsys):
    """The HAPT case: the zip's own bytes differ from the pinned SHA-256 (a re-packed archive),
    but the 7 files the converter reads match their pinned manifest: accepted, and said so."""
    raw = hapt_raw(tmp_path / "raw")
    zip_tree(raw, www / "hapt.zip", top="RawData/")
    pinned = manifest_sha256([(p.name, p.read_bytes()) for p in raw.iterdir()], text=True)
    _source(monkeypatch, "tiny-hapt", (Remote("hapt.zip", (f"{server}/hapt.zip",), "0" * 64),),
            contents=Contents(HAPT_FILES, 7, pinned, text=True), prepare=("hapt",))
    assert _cli("tiny-hapt", "--out", str(out)) == 0
    text = capsys.readouterr().out
    assert "(verified: the 7 files it must contain match their pinned SHA-256s)" in text
    assert f"note: the archive's sha256 differs from the pinned {'0' * 64}, but the 7" in text
    res = prepare("hapt", out / "hapt.zip", tmp_path / "h.npz")  # what was fetched converts
    assert res.sizes == {"train": 4, "test": 4}
    # line ends do not matter for text releases: the same files with CRLF match too
    crlf = hapt_raw(tmp_path / "crlf", crlf=True)
    assert manifest_sha256([(p.name, p.read_bytes()) for p in crlf.iterdir()], text=True) == pinned


def test_several_files_from_torchvisions_mnist_mirrors(server, www, out, monkeypatch, capsys):
    """MNIST's URLs come from torchvision's mirror list (here: a dead mirror, then ours); each
    file is checked against its pinned SHA-256 and torchvision's MD5; then `prepare mnist` reads
    the folder without --from."""
    from torchvision.datasets import MNIST

    files = mnist_release(www / "mnist")
    remotes = tuple(Remote(p.name, (), hashlib.sha256(p.read_bytes()).hexdigest(),
                           hashlib.md5(p.read_bytes()).hexdigest())
                    for p in sorted(files.iterdir()))
    monkeypatch.setitem(SOURCES, "mnist", dataclasses.replace(SOURCES["mnist"], files=remotes))
    monkeypatch.setattr(MNIST, "mirrors", [f"{server}/gone/", f"{server}/mnist/"])
    monkeypatch.setenv("RAYMM_DATA", str(out))
    assert _cli("mnist") == 0
    assert _listing(out) == sorted(r.filename for r in remotes)
    text = capsys.readouterr().out
    assert text.count("(verified: the pinned SHA-256)") == 4
    assert "next: raymm data prepare mnist\nnext: raymm data prepare mnist-train\n" in text
    assert _Handler.requests[:2] == ["/gone/t10k-images-idx3-ubyte.gz",
                                     "/mnist/t10k-images-idx3-ubyte.gz"]
    assert prepare("mnist").sizes == {"images": 30}
    assert mnist.torchvision_mnist_mirrors() == tuple(MNIST.mirrors)


# --------------------------------------------------------------------------- the three failures

def test_checksum_mismatch_is_one_line_and_leaves_nothing(server, out, capsys, monkeypatch):
    _source(monkeypatch, "tiny", (Remote("tiny.zip", (f"{server}/release.zip",), "0" * 64),))
    assert _cli("tiny", "--out", str(out)) == 2
    assert _one_error_line(capsys) == (
        f"raymm: download tiny: {server}/release.zip: sha256 mismatch: got {DIGEST}, "
        f"expected {'0' * 64}; nothing was written")
    assert _listing(out) == []


def test_truncated_transfer_is_one_line_and_leaves_nothing(server, out, capsys, monkeypatch):
    _source(monkeypatch, "tiny", (Remote("tiny.zip", (f"{server}/cut/release.zip",), DIGEST),))
    assert _cli("tiny", "--out", str(out)) == 2
    half = len(PAYLOAD) // 2
    assert _one_error_line(capsys) == (
        f"raymm: download tiny: {server}/cut/release.zip: connection cut after {half} of "
        f"{len(PAYLOAD)} bytes; nothing was written")
    assert _listing(out) == []


def test_404_is_one_line_and_leaves_nothing(server, out, capsys, monkeypatch):
    _source(monkeypatch, "tiny", (Remote("tiny.zip", (f"{server}/missing.zip",), DIGEST),))
    assert _cli("tiny", "--out", str(out)) == 2
    assert _one_error_line(capsys) == (
        f"raymm: download tiny: {server}/missing.zip: HTTP 404 File not found; "
        f"nothing was written")
    assert _listing(out) == []


def test_an_archive_whose_files_differ_is_refused(server, www, out, tmp_path, monkeypatch,
                                                  capsys):
    raw = hapt_raw(tmp_path / "raw")
    pinned = manifest_sha256([(p.name, p.read_bytes()) for p in raw.iterdir()], text=True)
    (raw / "labels.txt").write_text("1 1 5 1 129\n")  # one value changed
    zip_tree(raw, www / "hapt.zip")
    _source(monkeypatch, "tiny-hapt", (Remote("hapt.zip", (f"{server}/hapt.zip",)),),
            contents=Contents(HAPT_FILES, 7, pinned, text=True))
    assert _cli("tiny-hapt", "--out", str(out)) == 2
    err = _one_error_line(capsys)
    assert "its 7 files differ from the pinned release (manifest sha256" in err
    (raw / "gyro_exp03_user03.txt").unlink()
    zip_tree(raw, www / "hapt.zip")
    assert _cli("tiny-hapt", "--out", str(out)) == 2
    assert "it holds 6 of the 7 files the release must contain" in _one_error_line(capsys)
    (www / "hapt.zip").write_bytes(PAYLOAD)
    assert _cli("tiny-hapt", "--out", str(out)) == 2
    assert "it is not a readable zip" in _one_error_line(capsys)
    assert _listing(out) == []


def test_one_bad_file_of_several_leaves_none_of_them(server, www, out, monkeypatch, capsys):
    (www / "b.bin").write_bytes(b"b" * 1000)
    good = Remote("a.bin", (f"{server}/release.zip",), DIGEST)
    cut = Remote("b.bin", (f"{server}/cut/b.bin", f"{server}/nowhere/b.bin"),
                 hashlib.sha256(b"b" * 1000).hexdigest())
    _source(monkeypatch, "pair", (good, cut))
    assert _cli("pair", "--out", str(out)) == 2
    assert _one_error_line(capsys) == (
        f"raymm: download pair: b.bin: every mirror failed ({server}/cut/b.bin: connection cut "
        f"after 500 of 1000 bytes; {server}/nowhere/b.bin: HTTP 404 File not found); "
        f"nothing was written")
    assert _listing(out) == []  # a.bin had arrived whole, but the release did not


def test_interrupted_download_leaves_nothing(server, out, monkeypatch):
    _source(monkeypatch, "tiny", (Remote("tiny.zip", (f"{server}/release.zip",), DIGEST),))

    def ctrl_c(url, f, *args):
        f.write(PAYLOAD[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(dl, "_fetch", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        download("tiny", out, progress=False)
    assert _listing(out) == []


# --------------------------------------------------------------------------- other refusals

def test_existing_file_with_wrong_checksum_is_refused_until_force(server, out, monkeypatch):
    _source(monkeypatch, "tiny", (Remote("tiny.zip", (f"{server}/release.zip",), DIGEST),))
    out.mkdir()
    (out / "tiny.zip").write_bytes(b"stale")
    with pytest.raises(DataError, match=r"tiny.zip exists but sha256 mismatch: .*pass --force"):
        download("tiny", out, progress=False)
    res = download("tiny", out, force=True, progress=False)
    assert res.files[0].verified == "sha256" and not res.files[0].already
    assert (out / "tiny.zip").read_bytes() == PAYLOAD and _listing(out) == ["tiny.zip"]


def test_unverifiable_download_is_reported_as_such(server, out, monkeypatch):
    _source(monkeypatch, "bare", (Remote("bare.zip", (f"{server}/release.zip",)),))
    res = download("bare", out, progress=True)  # tqdm bar on stderr
    assert res.path == out / "bare.zip"
    f = res.files[0]
    assert (f.sha256, f.size, f.verified, f.already) == (DIGEST, len(PAYLOAD), None, False)


def test_bad_options_are_one_line(server, out, capsys):
    assert _cli("uci-har", "--out", str(out), "--sha256", "abc") == 2
    assert "--sha256 must be 64 hex digits, got 'abc'" in _one_error_line(capsys)
    assert _cli("mnist", "--out", str(out), "--sha256", DIGEST) == 2
    assert "--sha256 applies to a one-file release; mnist has 4 files" in _one_error_line(capsys)
    assert _cli("mnist", "--out", str(out), "--url", f"{server}/x.gz") == 2
    assert "--url must be a folder URL ending in '/'" in _one_error_line(capsys)
    with pytest.raises(RaymmError, match="no public source known for 'crema-d'"):
        download("crema-d", out)
    assert _listing(out) == []


def test_every_source_is_pinned_and_names_its_converters():
    from raymm.data.releases import CONVERTERS

    assert sorted(SOURCES) == ["fsdd", "hapt", "mnist", "uci-har"]
    for src in SOURCES.values():
        assert src.licence and src.homepage.startswith("https://")
        assert all(c in CONVERTERS and CONVERTERS[c].source == src.name for c in src.prepare)
        for f in src.files:
            assert f.sha256 or src.contents, f"{src.name}: {f.filename} has no checksum"
            assert all(u.startswith(("https://", "http://yann.lecun.com/")) for u in f.urls)
    assert SOURCES["hapt"].contents is not None and SOURCES["hapt"].contents.count == 123
    assert SOURCES["fsdd"].contents is not None and SOURCES["fsdd"].contents.count == 3000
