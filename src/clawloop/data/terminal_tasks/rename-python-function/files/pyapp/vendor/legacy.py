def get_user(user_id):
    return f"legacy-{user_id}"
