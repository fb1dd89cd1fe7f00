"""The playwright backend: attaches to chromium's DevTools port with `connect_over_cdp`.

It needs no driver binary matched to the browser's version, keeps one persistent
connection, gives each episode its own browser context (cookies, storage and cache
are not shared; non-file requests are aborted per context) and screenshots a clip
directly. Its sync API belongs to one thread: `Browser` makes every call on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clawloop.envs.gui.backend import Backend
from clawloop.envs.gui.chromium import TASK_AREA, VIEWPORT, own_children


class PlaywrightBackend(Backend):
    name = "playwright"

    def start(self, port: int, action_timeout_s: float) -> None:
        from playwright.sync_api import sync_playwright  # lazy: playwright is an optional dependency ([gui])

        self.timeout_ms = action_timeout_s * 1000
        before = own_children("playwright")
        self.pw = sync_playwright().start()
        self.driver_pids = sorted(set(own_children("playwright")) - set(before))  # its node driver (not killed
        # here: it exits with its pipe, when `stop` or this process ends)
        self.browser = self.pw.chromium.connect_over_cdp(f"http://127.0.0.1:{port}", timeout=self.timeout_ms)

    def version(self) -> str:
        return self.browser.version

    def new_page(self) -> Any:
        ctx = self.browser.new_context(viewport={"width": VIEWPORT[0], "height": VIEWPORT[1]}, device_scale_factor=1,
                                       locale="en-US", timezone_id="UTC", service_workers="block",
                                       accept_downloads=False)
        ctx.route(lambda url: not url.startswith(("file:", "data:", "about:", "blob:")), lambda route: route.abort())
        ctx.set_default_timeout(self.timeout_ms)
        page = ctx.new_page()
        return page

    def close_page(self, page: Any) -> None:
        page.context.close()

    def goto(self, page: Any, url: str) -> None:
        page.goto(url, wait_until="load")

    def eval(self, page: Any, fn: str, arg: Any = None) -> Any:
        return page.evaluate(fn, arg)

    def click(self, page: Any, x: float, y: float) -> None:
        page.mouse.click(x, y)

    def type_text(self, page: Any, text: str) -> None:
        page.keyboard.type(text)

    def press(self, page: Any, keys: list[str]) -> None:
        page.keyboard.press("+".join(keys))

    def wheel(self, page: Any, x: float, y: float, dx: float, dy: float) -> None:
        page.mouse.move(x, y)
        page.mouse.wheel(dx, dy)

    def screenshot(self, page: Any) -> bytes:
        return page.screenshot(type="png", clip={"x": 0, "y": 0, "width": TASK_AREA[0], "height": TASK_AREA[1]})

    def extra_pids(self) -> list[int]:
        return [p for p in self.driver_pids if Path(f"/proc/{p}").exists()]

    def stop(self) -> None:
        try:
            self.browser.close()
        finally:
            self.pw.stop()
