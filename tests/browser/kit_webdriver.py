#!/usr/bin/env python3
"""Drives the inference kit in real headless Chromium through ChromeDriver (W3C WebDriver),
as a person would: open the file, type a prompt, set the token count, press Generate, wait,
read the result. Standard library only.

usage: kit_webdriver.py KIT.html PROMPT TOKENS [WINDOWS.json]
prints one JSON object: {"status": ..., "text": ..., "bytes_hex": ..., "logits": [...]}, where
"logits" holds, for each token window in WINDOWS.json, the page's last-position logits as hex
f32 bit patterns.
"""
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Driver:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read() or b"{}").get("value")


@contextlib.contextmanager
def chromium_session(extra_args=()):
    """A ChromeDriver on a free port and one headless Chromium session through it: yields
    (driver, "/session/ID"); both end when the block does."""
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    chromedriver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    port = free_port()
    profile = tempfile.mkdtemp(prefix="lockstep-chromium-")
    proc = subprocess.Popen([chromedriver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        driver = Driver(port)
        for _ in range(100):
            try:
                driver.call("GET", "/status")
                break
            except OSError:
                time.sleep(0.1)
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", *extra_args, f"--user-data-dir={profile}"]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome",
                                                 "goog:chromeOptions": {"binary": chromium, "args": args}}}}
        session = driver.call("POST", "/session", caps)["sessionId"]
        s = f"/session/{session}"
        try:
            yield driver, s
        finally:
            driver.call("DELETE", s)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)


def main():
    kit, prompt, tokens = sys.argv[1], sys.argv[2], sys.argv[3]
    windows = json.load(open(sys.argv[4])) if len(sys.argv) > 4 else []
    with chromium_session() as (driver, s):
        driver.call("POST", s + "/url", {"url": "file://" + os.path.abspath(kit)})

        def find(css):
            return driver.call("POST", s + "/element", {"using": "css selector", "value": css})[ELEMENT]

        deadline = time.time() + 60
        while "ready" not in driver.call("GET", f"{s}/element/{find('#status')}/text"):
            if time.time() > deadline:
                raise SystemExit("the kit never became ready")
            time.sleep(0.1)
        box = find("#prompt")
        driver.call("POST", f"{s}/element/{box}/clear", {})
        driver.call("POST", f"{s}/element/{box}/value", {"text": prompt})
        count = find("#tokens")
        driver.call("POST", f"{s}/element/{count}/clear", {})
        driver.call("POST", f"{s}/element/{count}/value", {"text": tokens})
        driver.call("POST", f"{s}/element/{find('#generate')}/click", {})
        deadline = time.time() + 240
        status = ""
        while status != "done":
            status = driver.call("GET", f"{s}/element/{find('#status')}/text")
            if status.startswith("error") or time.time() > deadline:
                break
            time.sleep(0.2)
        output = find("#output")
        result = {
            "status": status,
            "text": driver.call("GET", f"{s}/element/{output}/text"),
            "bytes_hex": driver.call("GET", f"{s}/element/{output}/attribute/data-bytes"),
        }
        result["logits"] = [
            driver.call("POST", s + "/execute/sync",
                        {"script": "return window.lockstepKit.lastLogitsHex(arguments[0]);", "args": [w]})
            for w in windows
        ]
        print(json.dumps(result))


if __name__ == "__main__":
    main()
