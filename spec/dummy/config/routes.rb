# frozen_string_literal: true

Rails.application.routes.draw do
  # The dashboard, behind the host's authentication, as Sidekiq::Web is: a
  # routes constraint on the session. Without a signed-in operator the
  # route does not exist (404). /login/admin and /login/viewer stand in for
  # the application's own sign-in.
  constraints(->(request) { %w[admin viewer].include?(request.session[:operator]) }) do
    mount AceMQ::Web => "/acemq"
  end

  get "/login/:role", to: lambda { |env|
    request = ActionDispatch::Request.new(env)
    request.reset_session
    request.session[:operator] = request.path_parameters[:role] if %w[admin viewer].include?(request.path_parameters[:role])
    [302, { "location" => "/acemq", "content-type" => "text/plain" }, ["signed in\n"]]
  }
end
