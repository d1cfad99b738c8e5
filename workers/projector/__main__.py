from workers.projector.main import main

main()
