import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from users.repo import get_user, get_user_list  # noqa: E402
from users.names import get_username  # noqa: E402
from vendor.legacy import get_user as legacy_get_user  # noqa: E402

if __name__ == "__main__":
    print(get_user(1)["name"], len(get_user_list()), get_username(get_user(2)), legacy_get_user(3))
