"""`raymm data download` against a local HTTP server on 127.0.0.1 (no other address is used)."""

import functools
import hashlib
import http.server
import threading

import pytest

from raymm.app.cli import main
from raymm.data.download import SOURCES, download
from raymm.errors import DataError, RaymmError

PAYLOAD = bytes(range(256)) * 5000  # 1.28 MB: several read chunks
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()


def _cli(argv):
    """`raymm data ...` through the real entry point: errors -> one line, exit 2."""
    return main(list(argv))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    requests: list = []

    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):  # noqa: N802
        _Quiet.requests.append(self.path)
        super().do_GET()


@pytest.fixture
def server(tmp_path, monkeypatch):
    """Serves tmp_path/www at http://127.0.0.1:<port>/; proxies are switched off."""
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    www = tmp_path / "www"
    www.mkdir()
    (www / "release.zip").write_bytes(PAYLOAD)
    _Quiet.requests = []
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(www)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def test_download_verifies_prints_checksum_and_renames(server, tmp_path, capsys):
    out = tmp_path / "data"
    assert _cli(["data", "download", "uci-har", "--url", f"{server}/release.zip", "--out", str(out),
                 "--sha256", DIGEST.upper(), "--no-progress"]) == 0
    dest = out / SOURCES["uci-har"].filename
    assert dest.read_bytes() == PAYLOAD and list(out.iterdir()) == [dest]
    text = capsys.readouterr().out
    assert f"downloaded: {dest}" in text and f"sha256 {DIGEST} (verified)" in text
    assert f"next: raymm data prepare uci-har --from {dest}" in text
    # present already: nothing fetched, checksum still checked and printed
    assert _cli(["data", "download", "uci-har", "--url", f"{server}/release.zip", "--out", str(out),
                 "--sha256", DIGEST, "--no-progress"]) == 0
    assert f"already present: {dest}" in capsys.readouterr().out
    assert _Quiet.requests == ["/release.zip"]


def test_unknown_checksum_downloads_and_prints_it(server, tmp_path, monkeypatch):
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path / "data"))
    res = download("uci-har", url=f"{server}/release.zip", progress=True)  # tqdm bar on stderr
    assert res.path == tmp_path / "data" / "uci_har_dataset.zip"
    assert (res.sha256, res.size, res.verified, res.already) == (DIGEST, len(PAYLOAD), False, False)


def test_checksum_mismatch_exits_2_and_leaves_no_file(server, tmp_path, capsys):
    out = tmp_path / "data"
    assert _cli(["data", "download", "uci-har", "--url", f"{server}/release.zip", "--out", str(out),
                 "--sha256", "0" * 64, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"sha256 mismatch: got {DIGEST}, expected {'0' * 64}; nothing was written" in err
    assert err.count("\n") == 1 and list(out.iterdir()) == []


def test_existing_file_with_wrong_checksum_is_refused_until_force(server, tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    (out / "uci_har_dataset.zip").write_bytes(b"stale")
    with pytest.raises(DataError, match="exists but its sha256 is .*pass --force"):
        download("uci-har", out, url=f"{server}/release.zip", sha256=DIGEST, progress=False)
    res = download("uci-har", out, url=f"{server}/release.zip", sha256=DIGEST, force=True,
                   progress=False)
    assert res.verified and res.path.read_bytes() == PAYLOAD and len(list(out.iterdir())) == 1


def test_http_errors_and_bad_options_are_one_line(server, tmp_path, capsys):
    out = tmp_path / "data"
    assert _cli(["data", "download", "uci-har", "--url", f"{server}/missing.zip", "--out", str(out),
                 "--no-progress"]) == 2
    assert "HTTP 404" in capsys.readouterr().err and list(out.iterdir()) == []
    with pytest.raises(RaymmError, match="--sha256 must be 64 hex digits"):
        download("uci-har", out, url=f"{server}/release.zip", sha256="abc", progress=False)
    with pytest.raises(RaymmError, match="no public URL known for 'crema-d'"):
        download("crema-d", out)
    assert list(out.iterdir()) == []


def test_cli_main_exit_code(server, tmp_path, capsys):
    from raymm.app import cli

    out = tmp_path / "data"
    assert cli.main(["data", "download", "uci-har", "--url", f"{server}/release.zip",
                     "--out", str(out), "--sha256", "f" * 64, "--no-progress"]) == 2
    assert "sha256 mismatch" in capsys.readouterr().err and list(out.iterdir()) == []
    assert cli.main(["data"]) == 0 and "uci-har" in capsys.readouterr().out
