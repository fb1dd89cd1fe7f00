from users import repo


def get_username(user):
    return user["name"].title()


def first_name():
    return get_username(repo.get_user(1))
