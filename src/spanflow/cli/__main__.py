from spanflow.cli import main

main()
