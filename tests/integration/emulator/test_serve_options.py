"""``fabric-dra emulator serve`` options: TLS, accounts, no-auth mode, start-up errors, shutdown."""

from __future__ import annotations

import ssl
import subprocess
import threading
from pathlib import Path

import httpx
import pytest
import redfish
import trustme

from plumbing import procs
from tests.support.emulator import run_emulator


def _serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return procs.run(["emulator", "serve", *args], timeout=timeout)


def test_https_with_a_test_ca(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    with run_emulator(tmp_path, extra_args=["--tls-cert", str(cert_file), "--tls-key", str(key_file)]) as emu:
        assert emu.url.startswith("https://127.0.0.1:")
        verified = httpx.get(
            f"{emu.url}/redfish/v1/Systems",
            auth=emu.auth,
            verify=ssl.create_default_context(cafile=str(ca_file)),
        )
        assert verified.status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{emu.url}/redfish/v1/")  # the system trust store does not know the test CA
        client = redfish.redfish_client(
            base_url=emu.url, username=emu.username, password=emu.password, cafile=str(ca_file), timeout=30
        )
        client.login(auth="session")
        assert client.get("/redfish/v1/Fabrics").status == 200
        client.logout()


def test_explicit_credentials(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("correct horse battery staple\n")
    with run_emulator(tmp_path, extra_args=["--username", "operator", "--password-file", str(secret)]) as emu:
        assert not (emu.state_dir / "credentials.json").exists(), "a given password is not written anywhere"
        ok = httpx.get(f"{emu.url}/redfish/v1/Systems", auth=("operator", "correct horse battery staple"))
        assert ok.status_code == 200
        assert httpx.get(f"{emu.url}/redfish/v1/Systems", auth=("admin", "")).status_code == 401
        assert "correct horse" not in emu.log()


def test_insecure_no_auth_is_explicit_and_warned(tmp_path: Path) -> None:
    with run_emulator(tmp_path, extra_args=["--insecure-no-auth"]) as emu:
        assert httpx.get(f"{emu.url}/redfish/v1/Systems").status_code == 200
        assert "level=warning" in emu.log() and "authentication is disabled" in emu.log()
        assert httpx.get(f"{emu.url}/redfish/v1/AccountService/Accounts").json()["Members"] == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--tls-cert", "/etc/hostname"], "--tls-cert and --tls-key go together"),
        (["--latency", "warp-speed"], "latency profile 'warp-speed'"),
        (["--password", "x", "--password-file", "/dev/null"], "not both"),
        (["--insecure-no-auth", "--username", "root"], "--insecure-no-auth serves without accounts"),
    ],
)
def test_bad_options_are_one_clear_line(tmp_path: Path, args: list[str], expected: str) -> None:
    result = _serve("--state-dir", str(tmp_path / "state"), *args)
    assert result.returncode == 1
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr


def test_a_bad_topology_names_the_field(tmp_path: Path) -> None:
    topology = tmp_path / "bad.yaml"
    topology.write_text(
        "version: 1\nservice: {uuid: 7f8c2a4e-4b35-4a9e-9a0e-0d3b6f1c2a11}\n"
        "hosts: [{name: kind-worker, uuid: 4c4c4544-0000-4a10-8000-000000000001}]\n"
        "models: {}\npcie: {switches: [{id: sw0, devices: [{id: gpu0, model: h200, serial: '01'}]}]}\n"
    )
    result = _serve("--state-dir", str(tmp_path / "state"), "--topology", str(topology))
    assert result.returncode == 1
    assert "pcie.switches[0].devices[0].model: unknown model 'h200'" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        result = _serve("--state-dir", str(tmp_path / "other"), "--port", str(emu.port))
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{emu.port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_sigterm_ends_event_streams_and_exits_cleanly(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        opened, ended = threading.Event(), threading.Event()

        def listen() -> None:
            with httpx.stream(
                "GET", f"{emu.url}/redfish/v1/EventService/SSE", auth=emu.auth, timeout=30
            ) as stream:
                opened.set()
                for _ in stream.iter_lines():
                    pass
            ended.set()

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        assert opened.wait(timeout=30), "the event stream did not open"
        assert emu.stop() == 0
        listener.join(timeout=30)
        assert ended.is_set(), "the event stream must end when the emulator stops"
        assert "emulator stopped" in emu.log()
