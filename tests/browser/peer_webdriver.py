#!/usr/bin/env python3
"""Opens the browser peer page (peer.html, served by a real `lockstep signal --static`) in real
headless Chromium through ChromeDriver, waits until it has joined the mesh and exchanged large
messages with a Lockstep node (or the time is up), and prints the page's `window.result` as one
JSON object. Standard library only.

usage: peer_webdriver.py URL SECONDS
"""
import json
import sys
import time

from kit_webdriver import chromium_session


def main():
    url, seconds = sys.argv[1], float(sys.argv[2])
    with chromium_session(["--allow-loopback-in-peer-connection"]) as (driver, s):
        driver.call("POST", s + "/url", {"url": url})
        read = {"script": "return window.result;", "args": []}
        deadline = time.time() + seconds
        result = {}
        while time.time() < deadline:
            result = driver.call("POST", s + "/execute/sync", read)
            large = [n for n in result.get("received", []) if n > 40000]
            if result.get("state") == "open" and large and result.get("sent"):
                # Stay a little longer: a connection the large messages broke closes now.
                time.sleep(2)
                result = driver.call("POST", s + "/execute/sync", read)
                break
            time.sleep(0.2)
        print(json.dumps(result))


if __name__ == "__main__":
    main()
