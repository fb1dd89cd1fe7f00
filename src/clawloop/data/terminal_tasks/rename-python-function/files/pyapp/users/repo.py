USERS = {1: {"name": "ada"}, 2: {"name": "linus"}}


def get_user(user_id):
    """Return one user (get_user is cached upstream)."""
    return USERS[user_id]


def get_user_list():
    return [get_user(i) for i in sorted(USERS)]
