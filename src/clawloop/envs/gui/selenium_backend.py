"""The selenium backend: chromedriver ($CLAWLOOP_CHROMEDRIVER, else /usr/bin/chromedriver) with `debuggerAddress`.

For setups that standardise on WebDriver, and to check that results do not depend
on the driver. Episodes are tabs of one profile; chromedriver runs under the same
kind of watchdog as chromium, so it goes with this process however it ends.
"""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from clawloop.envs.gui.backend import Backend
from clawloop.envs.gui.chromium import (TASK_AREA, VIEWPORT, chromedriver_path, group_pids, kill_group, register_group,
                                         unregister_group)


class SeleniumBackend(Backend):
    name = "selenium"

    def start(self, port: int, action_timeout_s: float) -> None:
        # selenium is imported in the methods that use it: an optional dependency ([gui])
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.debugger_address = f"127.0.0.1:{port}"
        self.service = Service(executable_path=self._watched_driver(), log_output=subprocess.DEVNULL,
                               popen_kw={"start_new_session": True})
        self.driver = webdriver.Chrome(service=self.service, options=options)
        proc = getattr(self.service, "process", None)
        self.driver_pid = proc.pid if proc is not None else 0
        if self.driver_pid:
            register_group(self.driver_pid)
        self.driver.set_script_timeout(action_timeout_s)
        self.driver.set_page_load_timeout(action_timeout_s)
        self.home = self.driver.current_window_handle  # the first tab stays open: closing the last ends the session
        self.current = self.home

    def _watched_driver(self) -> str:
        """chromedriver under the same kind of watchdog as chromium (selenium keeps its stdin open): it goes
        with this process however this process ends. Plain chromedriver where a script cannot run."""
        path = Path(tempfile.mkdtemp(prefix="clawloop-chromedriver-")) / "chromedriver"
        self.wrapper_dir = str(path.parent)
        path.write_text(f"#!/bin/sh\n{shlex.quote(chromedriver_path())} \"$@\" </dev/null &\nread _\nkill -9 -$$\n")
        path.chmod(0o700)
        if os.statvfs(path.parent).f_flag & os.ST_NOEXEC:
            return chromedriver_path()
        return str(path)

    def version(self) -> str:
        return str(self.driver.capabilities.get("browserVersion", ""))

    def extra_pids(self) -> list[int]:
        return group_pids(self.driver_pid) if self.driver_pid else []

    def _on(self, page: Any) -> None:
        if self.current != page:
            self.driver.switch_to.window(page)
            self.current = page

    def new_page(self) -> Any:
        self.driver.switch_to.new_window("tab")
        self.current = handle = self.driver.current_window_handle
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                    {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1,
                                     "mobile": False})
        self.driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "UTC"})
        self.driver.execute_cdp_cmd("Emulation.setLocaleOverride", {"locale": "en-US"})
        return handle

    def close_page(self, page: Any) -> None:
        self._on(page)
        self.driver.close()
        self.driver.switch_to.window(self.home)
        self.current = self.home

    def goto(self, page: Any, url: str) -> None:
        self._on(page)
        self.driver.get(url)

    def eval(self, page: Any, fn: str, arg: Any = None) -> Any:
        self._on(page)
        return self.driver.execute_script(f"return ({fn})(arguments[0]);", arg)

    def click(self, page: Any, x: float, y: float) -> None:
        from selenium.webdriver.common.actions.action_builder import ActionBuilder

        self._on(page)
        ab = ActionBuilder(self.driver, duration=0)
        ab.pointer_action.move_to_location(int(round(x)), int(round(y)))
        ab.pointer_action.click()
        ab.perform()

    def type_text(self, page: Any, text: str) -> None:
        from selenium.webdriver.common.action_chains import ActionChains

        self._on(page)
        ActionChains(self.driver, duration=0).send_keys(text).perform()

    def press(self, page: Any, keys: list[str]) -> None:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        special = {"Enter": Keys.ENTER, "Tab": Keys.TAB, "Escape": Keys.ESCAPE, "Backspace": Keys.BACKSPACE,
                   "Delete": Keys.DELETE, "ArrowUp": Keys.ARROW_UP, "ArrowDown": Keys.ARROW_DOWN,
                   "ArrowLeft": Keys.ARROW_LEFT, "ArrowRight": Keys.ARROW_RIGHT, "Home": Keys.HOME, "End": Keys.END,
                   "PageUp": Keys.PAGE_UP, "PageDown": Keys.PAGE_DOWN, "Insert": Keys.INSERT,
                   "Control": Keys.CONTROL, "Shift": Keys.SHIFT, "Alt": Keys.ALT, "Meta": Keys.META}
        special.update({f"F{i}": getattr(Keys, f"F{i}") for i in range(1, 13)})
        self._on(page)
        codes = [special.get(k, k) for k in keys]
        chain = ActionChains(self.driver, duration=0)
        for mod in codes[:-1]:
            chain.key_down(mod)
        chain.send_keys(codes[-1])
        for mod in reversed(codes[:-1]):
            chain.key_up(mod)
        chain.perform()

    def wheel(self, page: Any, x: float, y: float, dx: float, dy: float) -> None:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.actions.wheel_input import ScrollOrigin

        self._on(page)
        ActionChains(self.driver, duration=0).scroll_from_origin(
            ScrollOrigin.from_viewport(int(x), int(y)), int(dx), int(dy)).perform()

    def screenshot(self, page: Any) -> bytes:
        self._on(page)
        sx, sy = self.driver.execute_script("return [window.scrollX, window.scrollY];")
        shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "clip": {"x": sx, "y": sy, "width": TASK_AREA[0], "height": TASK_AREA[1], "scale": 1}})
        return base64.b64decode(shot["data"])

    def stop(self) -> None:
        try:
            if getattr(self, "driver", None) is not None:
                self.driver.quit()
        finally:
            if getattr(self, "driver_pid", 0):
                kill_group(self.driver_pid)
                unregister_group(self.driver_pid)
            if getattr(self, "wrapper_dir", ""):
                shutil.rmtree(self.wrapper_dir, ignore_errors=True)
