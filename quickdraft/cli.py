def main():
    print("quickdraft")
