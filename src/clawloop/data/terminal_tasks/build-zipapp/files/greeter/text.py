def greeting(name, shout=False):
    text = f"Hello, {name}!"
    return text.upper() if shout else text
