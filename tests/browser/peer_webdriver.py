#!/usr/bin/env python3
"""Opens the browser peer page (peer.html, served by a real `lockstep signal --static`) in real
headless Chromium through ChromeDriver, waits until it has joined the mesh and exchanged large
messages with a Lockstep node (or the time is up), and prints the page's `window.result` as one
JSON object. Standard library only.

usage: peer_webdriver.py URL SECONDS
"""
import json
import shutil
import subprocess
import sys
import tempfile
import time

from kit_webdriver import Driver, free_port


def main():
    url, seconds = sys.argv[1], float(sys.argv[2])
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
                "--disable-dev-shm-usage", "--allow-loopback-in-peer-connection", f"--user-data-dir={profile}"]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome",
                                                 "goog:chromeOptions": {"binary": chromium, "args": args}}}}
        session = driver.call("POST", "/session", caps)["sessionId"]
        s = f"/session/{session}"
        try:
            driver.call("POST", s + "/url", {"url": url})
            deadline = time.time() + seconds
            result = {}
            while time.time() < deadline:
                result = driver.call("POST", s + "/execute/sync", {"script": "return window.result;", "args": []})
                large = [n for n in result.get("received", []) if n > 40000]
                if result.get("state") == "open" and large and result.get("sent"):
                    # Stay a little longer: a connection the large messages broke closes now.
                    time.sleep(2)
                    result = driver.call("POST", s + "/execute/sync", {"script": "return window.result;", "args": []})
                    break
                time.sleep(0.2)
            print(json.dumps(result))
        finally:
            driver.call("DELETE", s)
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
