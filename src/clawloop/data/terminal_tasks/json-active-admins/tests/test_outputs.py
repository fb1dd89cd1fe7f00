import json


def users():
    return json.load(open("users.json"))["users"]


def test_admin_emails():
    want = sorted(u["email"] for u in users() if u["status"] == "active" and "admin" in u["roles"])
    assert json.load(open("admin_emails.json")) == want


def test_active_by_team():
    want = {}
    for u in users():
        if u["status"] == "active":
            want[u["team"]["name"]] = want.get(u["team"]["name"], 0) + 1
    assert json.load(open("active_by_team.json")) == want
