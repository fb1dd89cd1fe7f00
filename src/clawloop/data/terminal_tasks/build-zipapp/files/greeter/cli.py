import argparse

from greeter.text import greeting


def main():
    p = argparse.ArgumentParser(prog="greeter")
    p.add_argument("name")
    p.add_argument("--shout", action="store_true")
    a = p.parse_args()
    print(greeting(a.name, shout=a.shout))
